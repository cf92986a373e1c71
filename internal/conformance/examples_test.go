package conformance_test

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/clients/clienttest"
	"github.com/idemd/idemd/idem/replayauth"
	"github.com/idemd/idemd/internal/conformance"
	"github.com/idemd/idemd/internal/testing/testwait"
)

// flaskServer runs clients/python/example/flask_app.py's create_app on
// Flask's threaded server.
const flaskServer = `import sys
sys.path.insert(0, sys.argv[1])
import flask_app
host, port = sys.argv[3].rsplit(":", 1)
flask_app.create_app(sys.argv[2], sys.argv[4]).run(host=host, port=int(port), threaded=True)
`

// TestExampleAPIsPass: the example APIs in other languages, run as their
// own processes on a database of their own as the API's role, pass every
// scenario: orders_api.py and orders_api.rb with JSON bodies, and the
// Express and Flask apps with form bodies (replayed form-encoded, as the completer's
// --request-encoding form does).
func TestExampleAPIsPass(t *testing.T) {
	t.Parallel()
	python := clienttest.Python(t)
	example := filepath.Join(clienttest.Root(t), "clients", "python", "example")
	secretFile := filepath.Join(t.TempDir(), "replay-secret")
	if err := os.WriteFile(secretFile, []byte(testSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	secrets, err := replayauth.ReadSecretFiles(secretFile)
	if err != nil {
		t.Fatal(err)
	}
	users := func(t *conformance.Template) {
		t.Method, t.Path = "POST", "/orders"
		t.Headers = map[string]string{"Authorization": "Bearer user-41"}
		t.SecondUser = &conformance.User{Headers: map[string]string{"Authorization": "Bearer user-42"}}
	}

	t.Run("orders_api.py", func(t *testing.T) {
		db := clienttest.NewAPIDatabase(t)
		addr := freeAddr(t)
		startProcess(t, python, filepath.Join(example, "orders_api.py"), "--addr", addr, "--database-url", db.APIURL,
			"--replay-secret-file", secretFile)
		tmpl := conformance.Template{Body: json.RawMessage(`{"sku": "book", "quantity": 2}`)}
		users(&tmpl)
		runExample(t, "http://"+addr, db.APIURL, tmpl, secrets)
	})
	t.Run("orders_api.rb", func(t *testing.T) {
		ruby := clienttest.Ruby(t)
		db := clienttest.NewAPIDatabase(t)
		addr := freeAddr(t)
		startProcess(t, ruby, filepath.Join(clienttest.Root(t), "clients", "ruby", "example", "orders_api.rb"), "--addr", addr,
			"--database-url", db.APIURL, "--replay-secret-file", secretFile)
		tmpl := conformance.Template{Body: json.RawMessage(`{"sku": "book", "quantity": 2}`)}
		users(&tmpl)
		runExample(t, "http://"+addr, db.APIURL, tmpl, secrets)
	})
	t.Run("express_app.js", func(t *testing.T) {
		node := clienttest.Node(t)
		dir := filepath.Join(clienttest.Root(t), "clients", "node", "example")
		clienttest.NodePackages(t, node, dir, "express", "pg", "idemd-replayauth")
		db := clienttest.NewAPIDatabase(t)
		ordersTableFor(t, db)
		addr := freeAddr(t)
		_, port, _ := net.SplitHostPort(addr)
		startProcessEnv(t, []string{"DATABASE_URL=" + db.APIURL, "IDEMD_REPLAY_SECRET_FILE=" + secretFile, "PORT=" + port},
			node, filepath.Join(dir, "express_app.js"))
		tmpl := conformance.Template{Encoding: "form", Body: json.RawMessage(`{"sku": "book", "quantity": "2"}`)}
		users(&tmpl)
		runExample(t, "http://"+addr, db.APIURL, tmpl, secrets)
	})
	t.Run("flask_app.py", func(t *testing.T) {
		db := clienttest.NewAPIDatabase(t)
		ordersTableFor(t, db)
		addr := freeAddr(t)
		startProcess(t, python, "-c", flaskServer, example, db.APIURL, addr, secretFile)
		tmpl := conformance.Template{Encoding: "form", Body: json.RawMessage(`{"sku": "book", "quantity": "2"}`)}
		users(&tmpl)
		runExample(t, "http://"+addr, db.APIURL, tmpl, secrets)
	})
}

// ordersTableFor creates the framework examples' table, which their
// docstrings give, granted to the API's role.
func ordersTableFor(t *testing.T, db clienttest.DB) {
	t.Helper()
	admin, err := pgxpool.New(context.Background(), db.AdminURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.Exec(context.Background(), `CREATE TABLE orders (id bigserial PRIMARY KEY, user_id bigint NOT NULL,
		key_id bigint NOT NULL UNIQUE, sku text NOT NULL, quantity int NOT NULL);
		GRANT SELECT, INSERT ON orders TO `+db.Role+`; GRANT USAGE ON SEQUENCE orders_id_seq TO `+db.Role); err != nil {
		t.Fatal(err)
	}
}

// runExample waits for the API and runs every scenario against it with
// the API's own database role; none may fail or be skipped.
func runExample(t *testing.T, apiURL, dbURL string, tmpl conformance.Template, secrets []replayauth.Secret) {
	t.Helper()
	testwait.Until(t, 20*time.Second, "the API to listen on "+apiURL, func() bool {
		c, err := net.Dial("tcp", apiURL[len("http://"):])
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	rep, err := conformance.Run(context.Background(), conformance.Config{APIURL: apiURL, Template: tmpl, Pool: pool, Secrets: secrets})
	if err != nil {
		t.Fatal(err)
	}
	logReport(t, rep)
	if rep.Failed != 0 || rep.Skipped != 0 {
		t.Fatalf("failed %v, skipped %d", rep.FailedNames(), rep.Skipped)
	}
	assertNoKeysLeft(t, pool)
}

// assertNoKeysLeft: the run leaves no unfinished key of its own for a
// completer to replay.
func assertNoKeysLeft(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys
		WHERE idempotency_key LIKE 'idemctl-conformance-%' AND recovery_point <> 'finished'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d unfinished keys of the run left behind", n)
	}
}

// startProcess starts an API process, stopped (and waited for) when the
// test ends; its output goes to the test log on failure.
func startProcess(t *testing.T, bin string, args ...string) {
	t.Helper()
	startProcessEnv(t, nil, bin, args...)
}

// startProcessEnv is startProcess with env added to the environment.
func startProcessEnv(t *testing.T, env []string, bin string, args ...string) {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), "api.log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
		f.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			t.Logf("--- API log (tail):\n%s", b)
		}
	})
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

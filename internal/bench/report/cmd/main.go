// Command benchreport runs every benchmark suite of idemd in one process and
// prints one table (also written to -out). `make bench` runs it.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/idemd/idemd/internal/bench/report"
)

func main() {
	out := flag.String("out", "bench-report.txt", "file the report is also written to")
	db := flag.String("database-url", envOr("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"), "admin URL of the server; each suite creates and drops its own database")
	scale := flag.Float64("scale", 1, "fraction of the issues' sizes (0.1 for a quick look)")
	suites := flag.String("suites", "enqueuer,takeover,reaper,completer,e2e,staging,migrations,adoption", "comma-separated suites to run")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "  "+format+"\n", args...)
	}
	host, _ := os.Hostname()
	rep := &benchreport.Report{Started: time.Now(), Host: host}
	failed := false
	for _, s := range strings.Split(*suites, ",") {
		run, ok := benchreport.Suites[strings.TrimSpace(s)]
		if !ok {
			fmt.Fprintf(os.Stderr, "benchreport: unknown suite %q\n", s)
			os.Exit(2)
		}
		fmt.Fprintf(os.Stderr, "== %s\n", s)
		if err := run(ctx, *db, benchreport.Scale(*scale), logf, rep); err != nil {
			fmt.Fprintf(os.Stderr, "benchreport: %v\n", err)
			rep.Notes = append(rep.Notes, fmt.Sprintf("suite %s failed: %v", s, err))
			failed = true
		}
	}
	rep.Took = time.Since(rep.Started)
	var buf bytes.Buffer
	if err := rep.Write(&buf); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Stdout.Write(buf.Bytes()) //nolint:errcheck
	if err := os.WriteFile(*out, buf.Bytes(), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if failed {
		os.Exit(1)
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

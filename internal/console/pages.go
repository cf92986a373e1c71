package console

import (
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/idemd/idemd/internal/operator"
)

// pageNames are the templates in templates/, each rendered inside
// layout.html.
var pageNames = []string{"status", "reviews", "key", "dead_list", "dead", "error"}

func parsePages() (map[string]*template.Template, error) {
	funcs := template.FuncMap{
		"ts": func(t any) string {
			switch t := t.(type) {
			case time.Time:
				return t.UTC().Format(time.RFC3339)
			case *time.Time:
				if t == nil {
					return "-"
				}
				return t.UTC().Format(time.RFC3339)
			}
			return fmt.Sprint(t)
		},
		"ago": func(now time.Time, t any) string {
			switch t := t.(type) {
			case time.Time:
				return operator.Age(now.Sub(t))
			case *time.Time:
				if t == nil {
					return "-"
				}
				return operator.Age(now.Sub(*t))
			}
			return ""
		},
		"secs": func(s float64) string { return operator.AgeSeconds(s) },
		// took is how long a run from start to end took; "-" without an end.
		"took": func(start time.Time, end *time.Time) string {
			if end == nil {
				return "-"
			}
			return operator.Age(end.Sub(start))
		},
		"str":    func(s *string) string { return deref(s) },
		"num":    func(i *int32) string { return intText(i) },
		"json":   func(raw []byte) string { return pretty(raw) },
		"join":   strings.Join,
		"id64":   func(i *int64) string { return int64Text(i) },
		"isOpen": func(r operator.Review) bool { return r.Open() },
		"dict": func(kv ...any) (map[string]any, error) {
			if len(kv)%2 != 0 {
				return nil, errors.New("dict: odd number of arguments")
			}
			m := make(map[string]any, len(kv)/2)
			for i := 0; i < len(kv); i += 2 {
				k, ok := kv[i].(string)
				if !ok {
					return nil, errors.New("dict: keys must be strings")
				}
				m[k] = kv[i+1]
			}
			return m, nil
		},
	}
	pages := make(map[string]*template.Template, len(pageNames))
	for _, name := range pageNames {
		t, err := template.New(name).Funcs(funcs).Option("missingkey=error").
			ParseFS(assets, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func intText(i *int32) string {
	if i == nil {
		return "-"
	}
	return strconv.Itoa(int(*i))
}

func int64Text(i *int64) string {
	if i == nil {
		return "-"
	}
	return strconv.FormatInt(*i, 10)
}

// statusData is the status page.
type statusData struct {
	*operator.Overview
	RiverStates []operator.GroupCount
	Actions     []operator.Action
}

func (s *Server) status(w http.ResponseWriter, r *http.Request, v *view) error {
	ov, err := operator.Status(r.Context(), s.cfg.Pool, s.cfg.Eligibility)
	if err != nil {
		return err
	}
	actions, err := operator.RecentActions(r.Context(), s.cfg.Pool, 20)
	if err != nil {
		return err
	}
	d := statusData{Overview: ov, Actions: actions}
	for _, st := range operator.LiveRiverStates {
		if n, ok := ov.RiverJobs[st]; ok {
			d.RiverStates = append(d.RiverStates, operator.GroupCount{Name: st, Count: n})
		}
	}
	v.Title, v.Nav, v.Data = "Status", "status", d
	s.render(w, http.StatusOK, "status", v)
	return nil
}

type reviewsData struct {
	State   string
	Reviews []operator.Review
	Now     time.Time
}

func (s *Server) reviews(w http.ResponseWriter, r *http.Request, v *view) error {
	state := r.URL.Query().Get("state")
	switch state {
	case "":
		state = "open"
	case "open", "resolved", "all":
	default:
		return &httpError{http.StatusBadRequest, "state must be open, resolved or all"}
	}
	list, err := operator.ListReviews(r.Context(), s.cfg.Pool, operator.ReviewFilter{State: state, Limit: 200})
	if err != nil {
		return err
	}
	v.Title, v.Nav, v.Data = "Reviews", "reviews", reviewsData{State: state, Reviews: list, Now: time.Now()}
	s.render(w, http.StatusOK, "reviews", v)
	return nil
}

func (s *Server) resolve(w http.ResponseWriter, r *http.Request, v *view) error {
	id, err := pathID(r)
	if err != nil {
		return err
	}
	n, err := note(r)
	if err != nil {
		return err
	}
	if _, err := operator.ResolveReview(r.Context(), s.cfg.Pool, id, s.actor(v), n); err != nil {
		return err
	}
	s.log.Info("console: review resolved", zap.String("operator", v.Operator), zap.Int64("review", id))
	return redirect(w, r, "/reviews", fmt.Sprintf("review %d resolved by %s", id, v.Operator))
}

type keyData struct {
	Ref    operator.KeyRef
	Report *operator.KeyReport
	Lookup bool
}

// keyLookup is the lookup form, and the report of ?id= or ?user_id=&key=.
func (s *Server) keyLookup(w http.ResponseWriter, r *http.Request, v *view) error {
	q := r.URL.Query()
	d := keyData{Lookup: true}
	v.Title, v.Nav = "Key lookup", "keys"
	if q.Get("id") == "" && q.Get("user_id") == "" && q.Get("key") == "" {
		v.Data = d
		s.render(w, http.StatusOK, "key", v)
		return nil
	}
	var err error
	if x := q.Get("id"); x != "" {
		if d.Ref.ID, err = strconv.ParseInt(x, 10, 64); err != nil {
			return &httpError{http.StatusBadRequest, "id must be a number"}
		}
	}
	if x := q.Get("user_id"); x != "" {
		if d.Ref.UserID, err = strconv.ParseInt(x, 10, 64); err != nil {
			return &httpError{http.StatusBadRequest, "user id must be a number"}
		}
	}
	d.Ref.Key = q.Get("key")
	return s.showKey(w, r, v, d)
}

func (s *Server) key(w http.ResponseWriter, r *http.Request, v *view) error {
	id, err := pathID(r)
	if err != nil {
		return err
	}
	v.Nav = "keys"
	return s.showKey(w, r, v, keyData{Ref: operator.KeyRef{ID: id}})
}

func (s *Server) showKey(w http.ResponseWriter, r *http.Request, v *view, d keyData) error {
	if p := d.Ref.Check(); len(p) > 0 {
		return &httpError{http.StatusBadRequest, strings.Join(p, "; ")}
	}
	rep, err := operator.ShowKey(r.Context(), s.cfg.Pool, d.Ref, s.cfg.GiveUpAfter)
	if err != nil {
		return err
	}
	d.Report = rep
	v.Title, v.Data = fmt.Sprintf("Key %d", rep.KeyID), d
	s.render(w, http.StatusOK, "key", v)
	return nil
}

func (s *Server) retry(w http.ResponseWriter, r *http.Request, v *view) error {
	id, err := pathID(r)
	if err != nil {
		return err
	}
	n, err := note(r)
	if err != nil {
		return err
	}
	res, err := operator.RetryKey(r.Context(), s.cfg.Pool, operator.RetryRequest{Ref: operator.KeyRef{ID: id}, Actor: s.actor(v), Note: n, GiveUpAfter: s.cfg.GiveUpAfter})
	if err != nil {
		return err
	}
	return redirect(w, r, fmt.Sprintf("/keys/%d", id), fmt.Sprintf("key %d handed back to the completer by %s (action %d)", id, res.By, res.ActionID))
}

type deadListData struct {
	Filter operator.DeadFilter
	Dead   []operator.DeadJob
}

func (s *Server) deadList(w http.ResponseWriter, r *http.Request, v *view) error {
	q := r.URL.Query()
	f := operator.DeadFilter{Kind: q.Get("kind"), Reason: q.Get("reason"), Limit: 200}
	list, err := operator.ListDead(r.Context(), s.cfg.Pool, f)
	if err != nil {
		return err
	}
	v.Title, v.Nav, v.Data = "Dead letters", "dead", deadListData{Filter: f, Dead: list}
	s.render(w, http.StatusOK, "dead_list", v)
	return nil
}

func (s *Server) dead(w http.ResponseWriter, r *http.Request, v *view) error {
	id, err := pathID(r)
	if err != nil {
		return err
	}
	rep, err := operator.ShowDead(r.Context(), s.cfg.Pool, id)
	if err != nil {
		return err
	}
	v.Title, v.Nav, v.Data = fmt.Sprintf("Staged job %d", id), "dead", rep
	s.render(w, http.StatusOK, "dead", v)
	return nil
}

func (s *Server) requeue(w http.ResponseWriter, r *http.Request, v *view) error {
	id, err := pathID(r)
	if err != nil {
		return err
	}
	n, err := note(r)
	if err != nil {
		return err
	}
	res, err := operator.RequeueDead(r.Context(), s.cfg.Pool, id, s.actor(v), n)
	if err != nil {
		return err
	}
	return redirect(w, r, fmt.Sprintf("/dead/%d", id), fmt.Sprintf("staged job %d requeued by %s (action %d)", id, res.By, res.ActionID))
}

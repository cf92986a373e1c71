package daemon

import "errors"

// loggedError marks an error its command has already logged with its
// context (the reaper's run summary, the enqueuer's drain result), so
// MainWith does not log it a second time: one fatal error, one line.
type loggedError struct{ err error }

func (e *loggedError) Error() string { return e.err.Error() }
func (e *loggedError) Unwrap() error { return e.err }

// AlreadyLogged returns err marked as logged (nil stays nil). MainWith still
// turns it into exit code 1, or 2 for a *config.Error, which it prints.
func AlreadyLogged(err error) error {
	if err == nil {
		return nil
	}
	return &loggedError{err: err}
}

// alreadyLogged reports whether err, or an error it wraps, was marked.
func alreadyLogged(err error) bool {
	var l *loggedError
	return errors.As(err, &l)
}

//go:build !linux

package dbcall

import "syscall"

// setUserTimeout does nothing where TCP_USER_TIMEOUT does not exist (the
// released darwin binaries, run by an operator at a terminal): there the
// keepalives and each call's deadline bound a silent connection.
func setUserTimeout(_, _ string, _ syscall.RawConn) error { return nil }

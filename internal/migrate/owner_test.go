package migrate

import (
	"errors"
	"testing"
)

// TestDecideOwner is the rule of owner.go over every kind of login role:
// the migrator itself, a member (a Vault lease), a superuser with and
// without the group role, a role that is not a member (the runtime), and a
// member through a transaction-mode pooler.
func TestDecideOwner(t *testing.T) {
	for _, tc := range []struct {
		name    string
		s       ownerState
		txPool  bool
		setRole string
		refused bool
	}{
		{"the migrator itself", ownerState{current: "idemd_migrator", exists: true, member: true}, false, "", false},
		{"the migrator through a transaction pooler", ownerState{current: "idemd_migrator", exists: true, member: true}, true, "", false},
		{"a lease user", ownerState{current: "v-idemd-migr-1", exists: true, member: true}, false, "idemd_migrator", false},
		{"a superuser where roles.sql ran", ownerState{current: "postgres", superuser: true, exists: true, member: true, prepared: true}, false, "idemd_migrator", false},
		{"a superuser where the role exists but roles.sql did not run", ownerState{current: "postgres", superuser: true, exists: true, member: true}, false, "", false},
		{"a superuser without roles.sql", ownerState{current: "postgres", superuser: true}, false, "", false},
		{"the runtime", ownerState{current: "idemd_runtime", exists: true}, false, "", true},
		{"a role without roles.sql", ownerState{current: "app"}, false, "", true},
		{"River's owner, not a member", ownerState{current: "api", exists: true, ownsRiver: true}, false, "", false},
		{"River's owner and a member", ownerState{current: "api", exists: true, member: true, ownsRiver: true}, false, "idemd_migrator", false},
		{"a lease user through a transaction pooler", ownerState{current: "v-idemd-migr-1", exists: true, member: true}, true, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			role, err := decideOwner(tc.s, tc.txPool)
			var re *RoleError
			if got := errors.As(err, &re); got != tc.refused {
				t.Fatalf("decideOwner(%+v, %v) error %v; want refused=%v", tc.s, tc.txPool, err, tc.refused)
			}
			if role != tc.setRole {
				t.Errorf("decideOwner(%+v, %v) = %q; want %q", tc.s, tc.txPool, role, tc.setRole)
			}
		})
	}
}

package dbtest

// RolesLockKey is ApplyRoles' cross-process lock, for the test that holds
// it as another process would.
const RolesLockKey = rolesLockKey

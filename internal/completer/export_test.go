package completer

// For the external tests (bench_test.go) only.
var (
	CandidateSQLForTest     = candidateSQL
	CandidateLockingForTest = candidateLocking
)

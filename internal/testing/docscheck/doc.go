// Package docscheck holds the tests that keep the user documentation
// (README.md and docs/) honest against the code: every flag, environment
// variable, metric and manifest path a page names must exist, and the
// guides carry no lab notebook (dated runs, issue numbers), which belongs
// in docs/benchmarks/ alone.
package docscheck

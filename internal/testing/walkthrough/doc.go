// Package walkthrough runs the commands of docs/adopt.md: the page's
// fenced blocks marked `sh walkthrough`, in order, as one bash script, so
// the adoption guide cannot drift from the binaries, the roles file and the
// example APIs it uses.
package walkthrough

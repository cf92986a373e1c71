// Package console is the operator's web console (`idemctl console`,
// docs/console.md): the status overview, the review queue, a key's page
// and the dead letters as HTML, and the same writes as idemctl from POST
// forms. It is a face on internal/operator and defines no read or write of
// its own: each page renders what an operator function returns, and each
// form calls the operator function idemctl's command calls, with the
// console's identity (--operator or the proxy's header) as the actor.
package console

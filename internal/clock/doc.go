// Package clock lets time enter kvxfer through one small interface, so that the
// code that arms deadlines runs on the real clock in production and on a
// manually advanced clock in tests (no sleeps, no flakes).
package clock

// Package demo is `braid lab demo`: two sites joined by two ISPs, each path measured alone,
// then braid tunnel and braid proxy over both, with the checks that the combination beats the
// better path.
package demo

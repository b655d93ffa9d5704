// Package accuracy is the link emulator's accuracy check (`braid lab run accuracy`): RTT,
// goodput, loss, the queue bound, a cut and restored link, and trace replay, each measured
// on a two-host lab against its configured value (TESTING.md).
package accuracy

package accuracy

import (
	"context"
	"fmt"
	"math"
	"time"

	"braid/internal/experiment/kit"
	"braid/internal/lab"
	"braid/internal/traffic"
	"braid/internal/units"
)

// Trace links built in code: a shape replays a trace of lab/traces (or any file), and the
// emulator's accuracy check replays one under a saturating flow.

// traceCheckFile and traceCheckOffset are what the accuracy check replays: the busiest shipped
// trace, from 30 s in (the offset is part of what is checked).
const (
	traceCheckFile   = "TMobile-LTE-short.down"
	traceCheckOffset = 30 * time.Second
	traceCheckDelay  = 5 * time.Millisecond
	traceCheckWarmup = 2 * time.Second // for the flow to start and the queue to fill
)

// traceSecond is one compared window: the bytes the emulator delivered in it and the bytes the
// trace holds for the same window, shifted back by the delay and forward by the offset.
type traceSecond struct {
	from, to         time.Duration // link age at the samples
	delivered, trace int64
}

func (s traceSecond) rel() float64 { return float64(s.delivered)/float64(s.trace) - 1 }

// traceBound reports the worst relative error of the seconds and whether every second is
// within 5 % of the trace's bytes.
func traceBound(secs []traceSecond) (worst, meanAbs float64, ok bool) {
	ok = len(secs) > 0
	for _, s := range secs {
		if s.trace <= 0 {
			ok = false
			worst = math.Inf(1)
			continue
		}
		r := s.rel()
		meanAbs += math.Abs(r) / float64(len(secs))
		if math.Abs(r) > math.Abs(worst) {
			worst = r
		}
		if math.Abs(r) > 0.05 {
			ok = false
		}
	}
	return worst, meanAbs, ok
}

// TraceCheck replays a cellular trace (TMobile-LTE-short.down from 30 s in, 5 ms delay) under a
// saturating UDP flow of MTU-sized datagrams at 1.5 times the trace's busiest 100 ms, so the
// queue never runs empty and every opportunity carries a packet. Each second after a 2 s warm-up
// (10 s quick, 20 s otherwise), the bytes the emulator delivered on the link (its Stats.Bytes:
// IP bytes written to the receiving end, sampled with the link's Age) are compared with the
// bytes the trace holds for the same window: trace time (age-delay+offset) between the two
// samples, TraceOpportunity bytes a line. Bound: every second within ±5 %.
func TraceCheck() Check {
	return Check{Name: "trace " + traceCheckFile, Run: func(ctx context.Context, o kit.Options) (Row, error) {
		row := Row{Check: fmt.Sprintf("trace replay, bytes per second (%s from %v)", traceCheckFile, traceCheckOffset), Bound: "±5 % every second"}
		shape, err := kit.TraceShape(traceCheckFile, traceCheckOffset, traceCheckDelay)
		if err != nil {
			return row, err
		}
		seconds := 20
		if o.Quick {
			seconds = 10
		}
		tr := shape.Trace
		err = withPair(ctx, o, shape, func(l *lab.Lab) error {
			lk := l.Links()[0]
			mtu := lk.Spec.MTU
			// Send at 1.5 times the busiest 100 ms of what will be compared (and beyond).
			start := lk.Stats(0).Age + tr.Offset
			peak := int64(0)
			for t := start; t < start+time.Duration(seconds+4)*time.Second; t += 100 * time.Millisecond {
				peak = max(peak, tr.Bytes(t, t+100*time.Millisecond))
			}
			rate := uint64(float64(peak) * 8 * 10 * 1.5)
			dur := traceCheckWarmup + time.Duration(seconds)*time.Second + 500*time.Millisecond
			udp := make(chan error, 1)
			var res traffic.UDPResult
			go func() {
				var err error
				res, err = traffic.UDP(ctx, l.Host("a").Dial, pairServer, traffic.UDPOptions{Rate: rate, Size: mtu - 28, Duration: dur})
				udp <- err
			}()
			// Sample the delivered bytes once a second, from the end of the warm-up.
			time.Sleep(traceCheckWarmup)
			prev := lk.Stats(0)
			var secs []traceSecond
			for range seconds {
				select {
				case err := <-udp:
					return fmt.Errorf("udp flow ended early: %v", err)
				case <-time.After(time.Second - (lk.Stats(0).Age - prev.Age)):
				}
				cur := lk.Stats(0)
				shift := tr.Offset - shape.Delay
				secs = append(secs, traceSecond{from: prev.Age, to: cur.Age, delivered: int64(cur.Bytes - prev.Bytes),
					trace: tr.Bytes(prev.Age+shift, cur.Age+shift)})
				prev = cur
			}
			if err := <-udp; err != nil {
				return err
			}
			worst, meanAbs, ok := traceBound(secs)
			var delivered, want int64
			for _, s := range secs {
				delivered += s.delivered
				want += s.trace
			}
			span := (secs[len(secs)-1].to - secs[0].from).Seconds()
			row.Configured = fmt.Sprintf("%.2f Mbit/s over the %d s compared (trace %v..%v)", float64(want)*8/span/1e6, seconds,
				(secs[0].from + tr.Offset - shape.Delay).Round(time.Millisecond), (secs[len(secs)-1].to + tr.Offset - shape.Delay).Round(time.Millisecond))
			row.Measured = fmt.Sprintf("%.2f Mbit/s delivered", float64(delivered)*8/span/1e6)
			row.Error = fmt.Sprintf("worst second %+.2f %%, mean |error| %.2f %%", 100*worst, 100*meanAbs)
			row.OK = ok
			row.Want, row.Value, row.Unit = float64(want)*8/span/1e6, float64(delivered)*8/span/1e6, "Mbit/s"
			st := lk.Stats(0)
			row.Detail = fmt.Sprintf("UDP at %s (1.5 x the busiest 100 ms), %d queue drops; receiver got %d of %d datagrams",
				units.FormatRate(rate), st.DropQueue, res.Received, res.Sent)
			return nil
		})
		return row, err
	}}
}

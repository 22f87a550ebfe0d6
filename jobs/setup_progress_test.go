package jobs

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// setupCall is one call of SetupProgress, made after advancing the clock
// by dt: start (uses set), finish (seconds set) or advance.
type setupCall struct {
	dt                    time.Duration
	rank                  int
	stage, uses, model    string
	tensors, totalTensors int
	bytes, totalBytes     int64
	seconds               float64
}

func start(dt time.Duration, rank int, stage, uses, model string) setupCall {
	return setupCall{dt: dt, rank: rank, stage: stage, uses: uses, model: model}
}

func advance(dt time.Duration, rank int, stage string, tensors, totalTensors int, bytes, totalBytes int64) setupCall {
	return setupCall{dt: dt, rank: rank, stage: stage, tensors: tensors, totalTensors: totalTensors, bytes: bytes, totalBytes: totalBytes}
}

func finish(dt time.Duration, rank int, stage string, seconds float64) setupCall {
	return setupCall{dt: dt, rank: rank, stage: stage, seconds: seconds}
}

// runSetup makes the calls and returns the output and, for each call
// reported as one to log, "kind stage" with its status's counts.
func runSetup(stages, ranks int, term bool, width int, calls []setupCall) (string, []string) {
	var b strings.Builder
	clk := &fakeClock{t: t0}
	p := NewSetupProgress(&b, stages, ranks, term)
	p.now = clk.Now
	if width > 0 {
		p.SetWidth(width)
	}
	var logged []string
	for _, c := range calls {
		clk.Advance(c.dt)
		var (
			s    SetupStatus
			ok   bool
			kind string
		)
		switch {
		case c.uses != "":
			kind = "start"
			s, ok = p.Start(c.rank, c.stage, c.uses, c.model)
		case c.seconds > 0:
			kind = "finish"
			s, ok = p.Finish(c.rank, c.stage, c.seconds)
		default:
			kind = "progress"
			s, ok = p.Advance(c.rank, c.stage, c.tensors, c.totalTensors, c.bytes, c.totalBytes)
		}
		if ok {
			logged = append(logged, fmt.Sprintf("%s %s %d/%d %d/%d ranks %d/%d %.1fs", kind, s.Stage, s.Tensors, s.TotalTensors, s.Bytes, s.TotalBytes, s.RanksDone, s.Ranks, s.Seconds))
		}
	}
	p.Done()
	p.Start(0, "late", "x", "") // ignored after Done
	return b.String(), logged
}

func TestSetupProgress(t *testing.T) {
	const gib = 1 << 30
	ms := time.Millisecond
	// One rank: load_hf reports its checkpoint's totals, apply_fsdp2 reads
	// 4 GiB in four tensors.
	one := []setupCall{
		start(0, 0, "load", "load_hf", "actor"),
		advance(0, 0, "load", 0, 4, 0, 4*gib),
		finish(10*ms, 0, "load", 0.01),
		start(0, 0, "shard_actor", "apply_fsdp2", "actor"),
		advance(0, 0, "shard_actor", 0, 4, 0, 4*gib),
		advance(500*ms, 0, "shard_actor", 1, 4, gib, 4*gib),    // 25%, too soon for a line
		advance(1000*ms, 0, "shard_actor", 2, 4, 2*gib, 4*gib), // 50%
		advance(1500*ms, 0, "shard_actor", 3, 4, 3*gib, 4*gib), // 75%
		advance(50*ms, 0, "shard_actor", 4, 4, 4*gib, 4*gib),   // too soon
		finish(50*ms, 0, "shard_actor", 3.1),
	}
	// Two ranks of one stage, reading slowly: a line every ten seconds.
	two := []setupCall{
		start(0, 0, "shard", "apply_fsdp2", "actor"),
		start(0, 1, "shard", "apply_fsdp2", "actor"),
		advance(0, 0, "shard", 0, 100, 0, 100<<20),
		advance(0, 1, "shard", 0, 100, 0, 100<<20),
		advance(4*time.Second, 0, "shard", 2, 100, 2<<20, 100<<20),
		advance(7*time.Second, 1, "shard", 3, 100, 3<<20, 100<<20),
		advance(time.Second, 1, "shard", 100, 100, 100<<20, 100<<20),
		finish(0, 1, "shard", 12),
		advance(time.Second, 0, "shard", 100, 100, 100<<20, 100<<20),
		finish(0, 0, "shard", 13),
	}
	// Two ranks, rank 1 a stage behind: the terminal shows the stage that
	// started first until every rank finished it.
	behind := []setupCall{
		start(0, 0, "a", "load_hf", "actor"),
		start(0, 1, "a", "load_hf", "actor"),
		finish(10*ms, 0, "a", 0.01),
		start(0, 0, "b", "apply_fsdp2", "actor"),
		advance(0, 0, "b", 0, 2, 0, 2<<20),
		advance(200*ms, 0, "b", 1, 2, 1<<20, 2<<20),
		finish(0, 1, "a", 0.21),
		start(0, 1, "b", "apply_fsdp2", "actor"),
		advance(0, 1, "b", 0, 2, 0, 2<<20),
		advance(200*ms, 1, "b", 1, 2, 1<<20, 2<<20),
		advance(0, 0, "b", 2, 2, 2<<20, 2<<20),
		finish(0, 0, "b", 0.4),
		advance(200*ms, 1, "b", 2, 2, 2<<20, 2<<20),
		finish(0, 1, "b", 0.4),
	}
	tests := []struct {
		name       string
		stages     int
		ranks      int
		term       bool
		width      int
		calls      []setupCall
		want       string
		wantLogged []string
	}{
		{
			name: "plain", stages: 2, ranks: 1, calls: one,
			want: "setup 1/2 load (load_hf actor): started\n" +
				"setup 1/2 load: done in 0.01s, opened 4.0 GiB, 4 tensors\n" +
				"setup 2/2 shard_actor (apply_fsdp2 actor): started\n" +
				"setup 2/2 shard_actor: 2.0/4.0 GiB  50%, 2/4 tensors, 2s\n" +
				"setup 2/2 shard_actor: 3.0/4.0 GiB  75%, 3/4 tensors, 3s\n" +
				"setup 2/2 shard_actor: done in 3.1s, 4.0 GiB, 4 tensors\n",
			wantLogged: []string{
				"start load 0/0 0/0 ranks 0/1 0.0s",
				"finish load 0/4 0/4294967296 ranks 1/1 0.0s",
				"start shard_actor 0/0 0/0 ranks 0/1 0.0s",
				"progress shard_actor 2/4 2147483648/4294967296 ranks 0/1 1.5s",
				"progress shard_actor 3/4 3221225472/4294967296 ranks 0/1 3.0s",
				"finish shard_actor 4/4 4294967296/4294967296 ranks 1/1 3.1s",
			},
		},
		{
			name: "terminal", stages: 2, ranks: 1, term: true, width: 100, calls: one,
			want: "\rsetup 1/2 load (load_hf actor)  0s" +
				"\rsetup 1/2 load  opened 4.0 GiB  4 tensors  done in 0.01s\n" +
				"\rsetup 2/2 shard_actor (apply_fsdp2 actor)  0s" +
				"\rsetup 2/2 shard_actor  [=====>              ] 1.0/4.0 GiB  25%  1/4 tensors  1s" +
				"\rsetup 2/2 shard_actor  [==========>         ] 2.0/4.0 GiB  50%  2/4 tensors  2s" +
				"\rsetup 2/2 shard_actor  [===============>    ] 3.0/4.0 GiB  75%  3/4 tensors  3s" +
				"\rsetup 2/2 shard_actor  4.0 GiB  4 tensors  done in 3.1s" + strings.Repeat(" ", 24) + "\n",
		},
		{
			name: "terminal narrow drops the bar and tensors", stages: 2, ranks: 1, term: true, width: 50, calls: one[3:],
			want: "\rsetup 1/2 shard_actor (apply_fsdp2 actor)  0s" +
				"\rsetup 1/2 shard_actor  1.0/4.0 GiB  25%  1s  " +
				"\rsetup 1/2 shard_actor  2.0/4.0 GiB  50%  2s" +
				"\rsetup 1/2 shard_actor  3.0/4.0 GiB  75%  3s" +
				"\rsetup 1/2 shard_actor  4.0 GiB  done in 3.1s\n",
		},
		{
			name: "terminal very narrow", ranks: 1, term: true, width: 12, calls: one[3:5],
			want: "\rsetup shard\n",
		},
		{
			name: "plain ranks", stages: 1, ranks: 2, calls: two,
			want: "setup 1/1 shard (apply_fsdp2 actor): started\n" +
				"setup 1/1 shard: 5.0/200.0 MiB   2%, 5/200 tensors, ranks 0/2 done, 11s\n" +
				"setup 1/1 shard: 102.0/200.0 MiB  51%, 102/200 tensors, ranks 0/2 done, 12s\n" +
				"setup 1/1 shard: done in 13.0s, 200.0 MiB, 200 tensors\n",
			wantLogged: []string{
				"start shard 0/0 0/0 ranks 0/2 0.0s",
				"progress shard 5/200 5242880/209715200 ranks 0/2 11.0s",
				"progress shard 102/200 106954752/209715200 ranks 0/2 12.0s",
				"finish shard 200/200 209715200/209715200 ranks 2/2 13.0s",
			},
		},
		{
			name: "terminal ranks", stages: 1, ranks: 2, term: true, width: 120, calls: two,
			want: "\rsetup 1/1 shard (apply_fsdp2 actor)  ranks 0/2 done  0s" +
				"\rsetup 1/1 shard  [                    ] 2.0/200.0 MiB   1%  2/200 tensors  ranks 0/2 done  4s" +
				"\rsetup 1/1 shard  [                    ] 5.0/200.0 MiB   2%  5/200 tensors  ranks 0/2 done  11s" +
				"\rsetup 1/1 shard  [==========>         ] 102.0/200.0 MiB  51%  102/200 tensors  ranks 0/2 done  12s" +
				"\rsetup 1/1 shard  [====================] 200.0/200.0 MiB 100%  200/200 tensors  ranks 1/2 done  13s" +
				"\rsetup 1/1 shard  200.0 MiB  200 tensors  done in 13.0s" + strings.Repeat(" ", 44) + "\n",
		},
		{
			name: "terminal a rank behind", stages: 2, ranks: 2, term: true, width: 100, calls: behind,
			want: "\rsetup 1/2 a (load_hf actor)  ranks 0/2 done  0s" +
				"\rsetup 1/2 a  done in 0.21s                     \n" +
				"\rsetup 2/2 b  [=====>              ] 1.0 MiB  25%  1 tensor  ranks 0/2 done  0s" +
				"\rsetup 2/2 b  [==========>         ] 2.0/4.0 MiB  50%  2/4 tensors  ranks 0/2 done  0s" +
				"\rsetup 2/2 b  [====================] 4.0/4.0 MiB 100%  4/4 tensors  ranks 1/2 done  1s" +
				"\rsetup 2/2 b  4.0 MiB  4 tensors  done in 0.40s" + strings.Repeat(" ", 39) + "\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, logged := runSetup(tt.stages, tt.ranks, tt.term, tt.width, tt.calls)
			if got != tt.want {
				t.Errorf("got\n%q\nwant\n%q", got, tt.want)
			}
			if !tt.term && strings.Join(logged, "\n") != strings.Join(tt.wantLogged, "\n") {
				t.Errorf("logged\n%s\nwant\n%s", strings.Join(logged, "\n"), strings.Join(tt.wantLogged, "\n"))
			}
			if tt.term {
				for _, line := range strings.Split(got, "\r") {
					if l := len(strings.TrimRight(line, " \n")); l >= tt.width {
						t.Errorf("line of %d chars at width %d: %q", l, tt.width, line)
					}
				}
			}
		})
	}
}

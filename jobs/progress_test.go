package jobs

import (
	"errors"
	"math"
	"os"
	"strings"
	"testing"
	"time"
)

// step is one Update call, made after advancing the clock by dt.
type step struct {
	dt     time.Duration
	n      int
	fields []Field
}

func runProgress(total int, term bool, width int, steps []step) string {
	var b strings.Builder
	clk := &fakeClock{t: t0}
	p := NewProgress(&b, total, term)
	p.now = clk.Now
	p.start = clk.Now()
	if width > 0 {
		p.SetWidth(width)
	}
	for _, s := range steps {
		clk.Advance(s.dt)
		p.Update(s.n, s.fields...)
	}
	clk.Advance(time.Second)
	p.Done()
	p.Update(99) // ignored after Done
	return b.String()
}

func TestProgress(t *testing.T) {
	fields := func(loss, tps float64) []Field { return []Field{F("loss", loss), F("tok/s", tps)} }
	// A live GRPO step: the RL metrics among the others.
	rl := []step{{time.Second, 3, []Field{F("loss", -0.005461), F("reward", 0.53125), F("adv_logp", 0.001714), F("kl", 0.005263),
		F("entropy", 1.234), F("clipfrac", 0.0123), F("grad_norm", 0.7375), F("lr", 0.003), F("tok/s", 3944)}}}
	rlTail := "\nstopped at step 3/12 after 2s\n"
	three := []step{
		{10 * time.Second, 1, fields(0.6931, 12345)},
		{10 * time.Second, 2, fields(0.5, 1.5e6)},
		{10 * time.Second, 3, append(fields(0.25, 999), F("kl", 0.0012))},
	}
	tests := []struct {
		name  string
		total int
		term  bool
		width int
		steps []step
		want  string
	}{
		{
			name: "plain", total: 3, steps: three,
			want: "step 1/3 (33%) loss=0.6931 tok/s=12345 eta=20s elapsed=10s\n" +
				"step 2/3 (66%) loss=0.5 tok/s=1500000 eta=10s elapsed=20s\n" +
				"step 3/3 (100%) loss=0.25 tok/s=999 kl=0.0012 eta=0s elapsed=30s\n" +
				"done 3/3 steps in 31s\n",
		},
		{
			name: "plain resumed long", total: 1000,
			steps: []step{{90 * time.Second, 501, nil}, {90 * time.Second, 502, []Field{F("loss", math.NaN())}}},
			want: "step 501/1000 (50%) eta=12h28m elapsed=1m30s\n" +
				"step 502/1000 (50%) loss=NaN eta=12h27m elapsed=3m00s\n" +
				"stopped at step 502/1000 after 3m01s\n",
		},
		{
			name: "plain unknown total", total: 0, steps: []step{{time.Second, 1, fields(2, 10)}},
			want: "step 1 loss=2 tok/s=10 elapsed=1s\nstopped at step 1 after 2s\n",
		},
		{
			name: "plain no steps", total: 5,
			want: "no steps run in 1s\n",
		},
		{
			name: "terminal", total: 3, term: true, width: 80, steps: three,
			want: "\r[======>             ] 1/3  33%  12.3k tok/s  loss 0.6931  ETA 20s" +
				"\r[=============>      ] 2/3  66%  1.5M tok/s  loss 0.5  ETA 10s    " +
				"\r[====================] 3/3 100%  999 tok/s  loss 0.25  kl 0.0012  ETA 0s" +
				"\ndone 3/3 steps in 31s\n",
		},
		{
			name: "terminal wide", total: 4, term: true, width: 120, steps: three[:1],
			want: "\r[==========>                             ] 1/4  25%  12.3k tok/s  loss 0.6931  ETA 30s\n" +
				"stopped at step 1/4 after 11s\n",
		},
		{
			name: "terminal narrow drops bar then tok/s", total: 3, term: true, width: 40, steps: three[:1],
			want: "\r1/3  33%  loss 0.6931  ETA 20s\n" +
				"stopped at step 1/3 after 11s\n",
		},
		{
			name: "terminal very narrow", total: 3, term: true, width: 12, steps: three[:1],
			want: "\r1/3  33%\nstopped at step 1/3 after 11s\n",
		},
		{
			name: "terminal tiny", total: 300, term: true, width: 5, steps: []step{{time.Second, 100, nil}},
			want: "\r100/\nstopped at step 100/300 after 2s\n",
		},
		{
			name: "terminal default width", total: 100, term: true, steps: []step{{time.Second, 50, fields(1, 1)}},
			want: "\r[==========>         ] 50/100  50%  1 tok/s  loss 1  ETA 50s\n" +
				"stopped at step 50/100 after 2s\n",
		},
		{
			name: "plain RL", total: 12, steps: rl,
			want: "step 3/12 (25%) loss=-0.005461 reward=0.5312 adv_logp=0.001714 kl=0.005263 entropy=1.234 clipfrac=0.0123 grad_norm=0.7375 lr=0.003 tok/s=3944 eta=9s elapsed=1s" + rlTail,
		},
		{
			name: "terminal RL wide", total: 12, term: true, width: 160, steps: rl,
			want: "\r[==========>                             ] 3/12  25%  3.9k tok/s  reward 0.5312  loss -0.005461  kl 0.005263  ent 1.234  clip 0.0123  ETA 9s" + rlTail,
		},
		{
			name: "terminal RL shrinks the bar", total: 12, term: true, width: 120, steps: rl,
			want: "\r[==>       ] 3/12  25%  3.9k tok/s  reward 0.5312  loss -0.005461  kl 0.005263  ent 1.234  clip 0.0123  ETA 9s" + rlTail,
		},
		{
			name: "terminal RL drops the bar", total: 12, term: true, width: 100, steps: rl,
			want: "\r3/12  25%  3.9k tok/s  reward 0.5312  loss -0.005461  kl 0.005263  ent 1.234  clip 0.0123  ETA 9s" + rlTail,
		},
		{
			name: "terminal RL drops clipfrac", total: 12, term: true, width: 90, steps: rl,
			want: "\r3/12  25%  3.9k tok/s  reward 0.5312  loss -0.005461  kl 0.005263  ent 1.234  ETA 9s" + rlTail,
		},
		{
			name: "terminal RL drops tok/s", total: 12, term: true, width: 80, steps: rl,
			want: "\r3/12  25%  reward 0.5312  loss -0.005461  kl 0.005263  ent 1.234  ETA 9s" + rlTail,
		},
		{
			name: "terminal RL drops loss", total: 12, term: true, width: 60, steps: rl,
			want: "\r3/12  25%  reward 0.5312  kl 0.005263  ent 1.234  ETA 9s" + rlTail,
		},
		{
			name: "terminal RL drops entropy", total: 12, term: true, width: 50, steps: rl,
			want: "\r3/12  25%  reward 0.5312  kl 0.005263  ETA 9s" + rlTail,
		},
		{
			name: "terminal RL keeps the reward", total: 12, term: true, width: 40, steps: rl,
			want: "\r3/12  25%  reward 0.5312  ETA 9s" + rlTail,
		},
		{
			name: "terminal RL keeps the ETA", total: 12, term: true, width: 30, steps: rl,
			want: "\r3/12  25%  ETA 9s" + rlTail,
		},
		{
			name: "terminal keeps what it dropped", total: 12, term: true, width: 60, steps: []step{
				{time.Second, 1, []Field{F("loss", 0), F("kl", 0)}},
				{time.Second, 2, []Field{F("loss", -0.005461), F("kl", 0.005263)}},
				{time.Second, 3, []Field{F("loss", 0), F("kl", 0)}},
			},
			want: "\r[=>                  ] 1/12   8%  loss 0  kl 0  ETA 11s" +
				"\r2/12  16%  loss -0.005461  kl 0.005263  ETA 10s        " +
				"\r3/12  25%  loss 0  kl 0  ETA 9s                " +
				"\nstopped at step 3/12 after 4s\n",
		},
		{
			name: "terminal unknown total", total: 0, term: true, width: 80, steps: []step{{time.Second, 7, fields(1, 2500)}},
			want: "\rstep 7  2.5k tok/s  loss 1\nstopped at step 7 after 2s\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := runProgress(tt.total, tt.term, tt.width, tt.steps)
			if got != tt.want {
				t.Errorf("got\n%q\nwant\n%q", got, tt.want)
			}
			if tt.term {
				for _, line := range strings.Split(strings.TrimSuffix(got, "\n"), "\r") {
					w := tt.width
					if w == 0 {
						w = defaultWidth
					}
					if l := len(strings.SplitN(line, "\n", 2)[0]); l >= w {
						t.Errorf("line of %d chars at width %d: %q", l, w, line)
					}
				}
			}
		})
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("closed") }

func TestProgressWriteError(t *testing.T) {
	p := NewProgress(failWriter{}, 2, false)
	p.Update(1)
	p.Done()
	if err := p.Err(); err == nil || err.Error() != "closed" {
		t.Errorf("err = %v", err)
	}
}

func TestFormatDuration(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want string
	}{
		{-time.Second, "0s"}, {0, "0s"}, {1499 * time.Millisecond, "1s"}, {59 * time.Second, "59s"},
		{65 * time.Second, "1m05s"}, {time.Hour + 3*time.Minute + 59*time.Second, "1h03m"},
	}
	for _, tt := range tests {
		if got := formatDuration(tt.d); got != tt.want {
			t.Errorf("formatDuration(%v) = %q, want %q", tt.d, got, tt.want)
		}
	}
}

func TestIsTerminal(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "x")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if IsTerminal(nil) || IsTerminal(f) {
		t.Error("a regular file is not a terminal")
	}
	// A file is never asked for its width unless it is a terminal.
	p := NewProgress(f, 1, false)
	if w := p.width(); w != defaultWidth {
		t.Errorf("width = %d", w)
	}
}

// TestProgressRestart checks that the clock restarted after a long setup
// counts only the steps' time.
func TestProgressRestart(t *testing.T) {
	var b strings.Builder
	clk := &fakeClock{t: t0}
	p := NewProgress(&b, 3, false)
	p.now = clk.Now
	p.start = clk.Now()
	clk.Advance(40 * time.Second) // loading and sharding
	p.Restart()
	clk.Advance(10 * time.Second)
	p.Update(1)
	if want := "step 1/3 (33%) eta=20s elapsed=10s\n"; b.String() != want {
		t.Errorf("got %q, want %q", b.String(), want)
	}
}

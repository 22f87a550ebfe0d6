package launch

import (
	"slices"
	"strings"
	"testing"
)

func env(m map[string]string) Lookup {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestFromEnv(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		ok   bool
		want World
		err  string
	}{
		{name: "no launcher", env: map[string]string{"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_NTASKS": "4"}},
		{name: "torchrun", ok: true,
			env:  map[string]string{"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "node-a", "MASTER_PORT": "29400", "TORCHELASTIC_RUN_ID": "abc", "TORCHELASTIC_USE_AGENT_STORE": "True", "GROUP_RANK": "1"},
			want: World{Launcher: "torchrun", Rank: 3, Size: 8, LocalRank: 1, LocalSize: 2, Addr: "node-a:29401", Job: "abc"}},
		{name: "pytorchjob", ok: true,
			env:  map[string]string{"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456"},
			want: World{Launcher: "env", Rank: 1, Size: 2, Addr: "job-master-0:23456"}},
		{name: "rlpipe port wins", ok: true,
			env:  map[string]string{"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "::1", "MASTER_PORT": "1", "RLPIPE_PORT": "5000"},
			want: World{Launcher: "env", Rank: 0, Size: 2, Addr: "[::1]:5000"}},
		{name: "one process", ok: true, env: map[string]string{"WORLD_SIZE": "1"},
			want: World{Launcher: "env", Size: 1, Addr: "127.0.0.1:29500"}},
		{name: "srun", ok: true,
			env: map[string]string{"SLURM_STEP_NUM_TASKS": "8", "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
				"SLURM_STEP_TASKS_PER_NODE": "4(x2)", "SLURM_STEP_NODELIST": "gpu-[07-08]", "SLURM_JOB_ID": "123456", "SLURM_STEP_ID": "0"},
			want: World{Launcher: "slurm", Rank: 5, Size: 8, LocalRank: 1, LocalSize: 4, Addr: "gpu-07:23456", Job: "123456.0"}},
		{name: "srun with master", ok: true,
			env:  map[string]string{"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "0", "MASTER_ADDR": "head", "MASTER_PORT": "7777", "SLURM_STEP_NODELIST": "x1"},
			want: World{Launcher: "slurm", Size: 2, Addr: "head:7777"}},
		{name: "no master", env: map[string]string{"RANK": "0", "WORLD_SIZE": "2"}, err: "WORLD_SIZE is 2 but MASTER_ADDR is not set"},
		{name: "no rank", env: map[string]string{"WORLD_SIZE": "2", "MASTER_ADDR": "a"}, err: "RANK is not set"},
		{name: "bad number", env: map[string]string{"RANK": "x", "WORLD_SIZE": "2", "MASTER_ADDR": "a"}, err: `RANK="x" is not a non-negative integer`},
		{name: "rank outside", env: map[string]string{"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "a"}, err: "rank 2 is outside a world of 2"},
		{name: "bad node list", env: map[string]string{"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "0", "SLURM_STEP_NODELIST": "a[1-"}, err: "SLURM_STEP_NODELIST"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w, ok, err := FromEnv(env(tc.env))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || ok != tc.ok {
				t.Fatalf("ok %v err %v, want ok %v", ok, err, tc.ok)
			}
			w.Source = ""
			if w != tc.want {
				t.Errorf("got %+v\nwant %+v", w, tc.want)
			}
		})
	}
}

func TestExpandHostList(t *testing.T) {
	tests := []struct {
		in   string
		want []string
		err  bool
	}{
		{in: "", want: nil},
		{in: "login1", want: []string{"login1"}},
		{in: "gpu-[01-03,07],login1", want: []string{"gpu-01", "gpu-02", "gpu-03", "gpu-07", "login1"}},
		{in: "r[1-2]n[8-9]", want: []string{"r1n8", "r1n9", "r2n8", "r2n9"}},
		{in: "a[9-10]", want: []string{"a9", "a10"}},
		{in: "a[3-1]", err: true},
		{in: "a[1", err: true},
		{in: "a]1", err: true},
	}
	for _, tc := range tests {
		got, err := ExpandHostList(tc.in)
		if (err != nil) != tc.err || !slices.Equal(got, tc.want) {
			t.Errorf("ExpandHostList(%q) = %q, %v; want %q, error %v", tc.in, got, err, tc.want, tc.err)
		}
	}
}

func TestExpandCounts(t *testing.T) {
	got, err := expandCounts("4(x2),3")
	if err != nil || !slices.Equal(got, []int{4, 4, 3}) {
		t.Errorf("got %v, %v", got, err)
	}
	if _, err := expandCounts("4(x0)"); err == nil {
		t.Error("4(x0) accepted")
	}
}

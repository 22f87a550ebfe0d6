package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestCompletion checks that every shell's script names every command and
// every flag of each, as the commands define them, and that the scripts
// parse in the shells found on this machine.
func TestCompletion(t *testing.T) {
	specs := describeCommands()
	if len(specs) != len(commands()) {
		t.Fatalf("described %d commands of %d", len(specs), len(commands()))
	}
	for _, s := range specs {
		if s.name == "run" && len(s.flags) < 7 {
			t.Errorf("run has %d flags described; want its 7", len(s.flags))
		}
	}
	checks := map[string][]string{"bash": {"bash", "-n"}, "zsh": {"zsh", "-n"}, "fish": {"fish", "--no-execute"}}
	for _, shell := range []string{"bash", "zsh", "fish"} {
		t.Run(shell, func(t *testing.T) {
			code, script, stderr := runCLI(t, "completion", shell)
			if code != exitOK || stderr != "" {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			for _, s := range specs {
				if !strings.Contains(script, s.name) {
					t.Errorf("the %s script lacks command %s", shell, s.name)
				}
				// Each command's flags appear in its own part of the script:
				// its case up to ";;", or fish's lines conditioned on it.
				_, part, _ := strings.Cut(script, "\n\t"+s.name+")")
				part, _, _ = strings.Cut(part, ";;")
				if shell == "fish" {
					part = ""
					for _, l := range strings.Split(script, "\n") {
						if strings.Contains(l, "__fish_seen_subcommand_from "+s.name+"'") {
							part += l + "\n"
						}
					}
				}
				for _, f := range s.flags {
					word := "--" + f.Name
					if shell == "fish" {
						word = "-l " + f.Name
					}
					if !strings.Contains(part, word) {
						t.Errorf("the %s script lacks %s's flag --%s", shell, s.name, f.Name)
					}
				}
			}
			for _, w := range []string{"list show", "bash zsh fish"} {
				if !strings.Contains(script, w) {
					t.Errorf("the %s script lacks the words %q", shell, w)
				}
			}
			check := checks[shell]
			if _, err := exec.LookPath(check[0]); err != nil {
				t.Skipf("%s not found: the script's syntax is not checked", check[0])
			}
			path := filepath.Join(t.TempDir(), "rlpipe."+shell)
			if err := os.WriteFile(path, []byte(script), 0o644); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command(check[0], append(check[1:], path)...).CombinedOutput(); err != nil {
				t.Errorf("%s %s: %v\n%s", strings.Join(check, " "), path, err, out)
			}
		})
	}
}

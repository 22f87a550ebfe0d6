package reward

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// helperEnv, when set, makes the test binary act as a scorer program: the
// mode is its first argument (see helperMain). TestMain sets it for the
// children of the test process, so a command of {testBinary, mode} runs the
// helper without any external interpreter.
const helperEnv = "REWARD_TEST_HELPER"

// testBinary is the path of the test binary, the program of helper commands.
var testBinary string

func TestMain(m *testing.M) {
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "finding the test binary:", err)
		os.Exit(2)
	}
	testBinary = exe
	if os.Getenv(helperEnv) == "1" {
		os.Exit(helperMain(os.Args[1:]))
	}
	os.Setenv(helperEnv, "1")
	if os.Getenv("GORACE") == "" {
		// Under -race, a helper would otherwise sleep a second on exit.
		os.Setenv("GORACE", "atexit_sleep_ms=0")
	}
	os.Exit(m.Run())
}

// helperCommand returns the argv of the helper scorer in mode.
func helperCommand(mode string, args ...string) []string {
	return append([]string{testBinary, mode}, args...)
}

// helperMain is the scorer program of the command tests. It reads the batch
// from stdin and, depending on mode:
//
//	fields  answers each line as it reads it with {"reward": checksum} (see fieldsReward)
//	number  answers with plain numbers: len(response_tokens)
//	fail    prints to stderr and exits with status 3
//	short   answers all lines but the last
//	long    answers one line too many
//	bad     answers line 2 with a string reward
//	nan     answers line 1 with 1e999
//	sleep   never answers (sleeps a minute)
//	group   starts a grandchild (mode "orphan", pid written to args[0]) that
//	        holds stdout open, then sleeps
//	noread  answers without reading stdin (a batch larger than a pipe)
func helperMain(args []string) int {
	mode := args[0]
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(nil, 64<<20)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	read := func() []map[string]any {
		var lines []map[string]any
		for in.Scan() {
			var v map[string]any
			if err := json.Unmarshal(in.Bytes(), &v); err != nil {
				fmt.Fprintln(os.Stderr, "helper: bad input:", err)
				os.Exit(4)
			}
			lines = append(lines, v)
		}
		return lines
	}
	switch mode {
	case "fields":
		for in.Scan() {
			var w wireSample
			if err := json.Unmarshal(in.Bytes(), &w); err != nil {
				fmt.Fprintln(os.Stderr, "helper: bad input:", err)
				return 4
			}
			fmt.Fprintf(out, "{\"reward\": %s, \"note\": \"ok\"}\n", strconv.FormatFloat(fieldsReward(w), 'g', -1, 64))
			out.Flush() // answer as we read, as a streaming scorer would
		}
	case "number":
		for _, v := range read() {
			fmt.Fprintln(out, len(v["response_tokens"].([]any)))
		}
	case "fail":
		read()
		fmt.Fprintln(os.Stderr, "scorer: something broke")
		return 3
	case "short", "long":
		lines := read()
		n := len(lines) - 1
		if mode == "long" {
			n = len(lines) + 1
		}
		for range n {
			fmt.Fprintln(out, 1)
		}
	case "bad":
		for i := range read() {
			if i == 1 {
				fmt.Fprintln(out, `{"reward": "high"}`)
			} else {
				fmt.Fprintln(out, `{"reward": 1}`)
			}
		}
	case "nan":
		for i := range read() {
			if i == 0 {
				fmt.Fprintln(out, `1e999`)
			} else {
				fmt.Fprintln(out, `1`)
			}
		}
	case "sleep":
		fmt.Fprintln(os.Stderr, "scorer: sleeping")
		time.Sleep(time.Minute)
	case "group":
		child := exec.Command(testBinary, "orphan")
		child.Stdout = os.Stdout
		if err := child.Start(); err != nil {
			fmt.Fprintln(os.Stderr, "helper: starting the grandchild:", err)
			return 5
		}
		if err := os.WriteFile(args[1], []byte(strconv.Itoa(child.Process.Pid)), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			return 5
		}
		time.Sleep(time.Minute)
	case "orphan":
		time.Sleep(time.Minute)
	case "noread":
		n, _ := strconv.Atoi(args[1])
		for range n {
			fmt.Fprintln(out, 2)
		}
	default:
		fmt.Fprintln(os.Stderr, "helper: unknown mode", mode)
		return 2
	}
	return 0
}

// fieldsReward is a checksum of every field of a wire sample, so that a test
// can check that each one travelled.
func fieldsReward(w wireSample) float64 {
	r := float64(w.Index)*1e6 + float64(w.Group)*1e4 + float64(len(w.PromptTokens))*100 + float64(len(w.ResponseTokens))
	for _, t := range w.ResponseTokens {
		r += float64(t) * 1e-3
	}
	if w.Finish == "stop" {
		r += 0.5
	}
	if b, ok := w.Label["bonus"].(float64); ok {
		r += b * 1e-6
	}
	return r
}

package stages

import (
	"path/filepath"
	"testing"

	"github.com/rlpipe/rlpipe/spec"
)

// TestEnvParams checks the counts the policies see (model.params,
// model.param_bytes, layer.params), which Env takes from the model's
// count, counted once, against the inventory, for every model and unit.
func TestEnvParams(t *testing.T) {
	s, err := spec.Load(filepath.Join("..", "examples", "tiny-grpo.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	j := resolveSpec(t, s)
	st := j.Order[len(j.Order)-1]
	for name, m := range j.Models {
		want := m.Config.NumParams()
		for _, u := range m.Config.Units() {
			for range 2 { // the second call takes the count kept by the first
				env := j.Env(m, &u, st)
				if env.Model.Params != want || env.Model.ParamBytes != 4*want {
					t.Errorf("%s: model.params %d, param_bytes %d; want %d and %d", name, env.Model.Params, env.Model.ParamBytes, want, 4*want)
				}
				if env.Layer.Params != u.NumParams() {
					t.Errorf("%s %s %d: layer.params %d, want %d", name, u.Kind, u.Index, env.Layer.Params, u.NumParams())
				}
			}
		}
	}
}

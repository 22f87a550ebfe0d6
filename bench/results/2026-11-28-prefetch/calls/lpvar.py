# Writes forms of gpu/cuda/kernels/logprobs.cu's row statistics (k_lp_fwd
# and k_lp_bwd8's row_stats) to stdout; argv[1] is a list of changes
# joined by '+':
#   t1     the division by the temperature left out of the compiled code
#          when it is 1 (a template on it; the same bits);
#   u8     eight float4 loads in flight a thread instead of four (the same
#          order of values a thread, so the same bits);
#   fexp   the weights' exp on the special function unit (ex2.approx.ftz of
#          z - m times log2 e; different bits: diagnostic);
#   noexp  no exponential at all (the weight is z - m: diagnostic).
import sys
ch = sys.argv[1].split('+')
s = open(sys.argv[2]).read()
def rep(old, new, cnt=1):
    global s
    assert s.count(old) == cnt, (old, s.count(old))
    s = s.replace(old, new)
for c in ch:
    if c == 't1':
        rep('template <int MODE, int N>\n__device__ __forceinline__ void lp_step(', 'template <int MODE, int N, bool T1>\n__device__ __forceinline__ void lp_step(')
        rep('    z[k] = temp == 1.0f ? x[k] : x[k] / temp;', '    z[k] = T1 ? x[k] : x[k] / temp;')
        rep('template <int MODE>\n__device__ RowStats row_stats_m(', 'template <int MODE, bool T1>\n__device__ RowStats row_stats_m(')
        s = s.replace('lp_step<MODE, 1>(', 'lp_step<MODE, 1, T1>(').replace('lp_step<MODE, 4>(', 'lp_step<MODE, 4, T1>(')
        rep('''  if (!ent) return row_stats_m<LP_LSE>(l, v, temp, sh);
  if (tempered || temp == 1.0f) return row_stats_m<LP_ENT_Z>(l, v, temp, sh);
  return row_stats_m<LP_ENT_U>(l, v, temp, sh);''', '''  if (temp == 1.0f) {
    if (!ent) return row_stats_m<LP_LSE, true>(l, v, temp, sh);
    return row_stats_m<LP_ENT_Z, true>(l, v, temp, sh);
  }
  if (!ent) return row_stats_m<LP_LSE, false>(l, v, temp, sh);
  if (tempered) return row_stats_m<LP_ENT_Z, false>(l, v, temp, sh);
  return row_stats_m<LP_ENT_U, false>(l, v, temp, sh);''')
    elif c == 'u8':
        rep('''  for (; i + 3 * B < n4; i += 4 * B) {
    float4 q[4] = {l4[i], l4[i + B], l4[i + 2 * B], l4[i + 3 * B]};
#pragma unroll
    for (int u = 0; u < 4; u++) {''', '''  for (; i + 7 * B < n4; i += 8 * B) {
    float4 q[8];
#pragma unroll
    for (int u = 0; u < 8; u++) q[u] = l4[i + u * B];
#pragma unroll
    for (int u = 0; u < 8; u++) {''')
    elif c == 'fexp':
        rep('    double e = (double)expf(z - m);', '''    float e32;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e32) : "f"((z - m) * 1.44269502f));
    double e = (double)e32;''')
    elif c == 'noexp':
        rep('    double e = (double)expf(z - m);', '    double e = (double)(z - m);')
    else:
        raise SystemExit('unknown ' + c)
sys.stdout.write(s)

//! The gated activation against flint_core's reference: SiLU and GELU-tanh, out of place and
//! in place (into gate), odd widths, and extreme inputs that must stay finite.

use flint_core::arch::Activation;
use flint_core::reference::ops;
use flint_gpu::buffer::{read_f32, storage_init};
use flint_gpu::ops::glu::{Glu, GluDesc};
use flint_gpu::ops::Batch;
use flint_gpu::testing::{assert_untouched, nmse, padded, pipelines, submit, TestRng, NMSE_F32};
use flint_gpu::GpuContext;

const MAX_TOKENS: u32 = 16;

fn act_fn(act: Activation) -> fn(f32) -> f32 {
    match act {
        Activation::Silu => ops::silu,
        Activation::GeluTanh => ops::gelu_tanh,
    }
}

/// Runs act(gate)·up on the GPU; returns the whole output buffer (sentinels included).
async fn glu(ctx: &GpuContext, act: Activation, n_ff: usize, gate: &[f32], up: &[f32], in_place: bool) -> Vec<f32> {
    let n_tok = gate.len() / n_ff;
    let cap = MAX_TOKENS as usize * n_ff;
    let pad = |v: &[f32]| storage_init(ctx, "buf", bytemuck::cast_slice(&padded(v, cap))).unwrap();
    let (gb, ub) = (pad(gate), pad(up));
    let ob = if in_place { gb.clone() } else { pad(&[]) };
    let batch = Batch::new(ctx, MAX_TOKENS, 1, 1, 16).unwrap();
    batch.write(ctx, &vec![0; n_tok], &vec![0; n_tok], &vec![0; n_tok], &[]);
    let op = Glu::new(ctx, pipelines(), &batch, GluDesc { act, n_ff: n_ff as u32 }, &gb, &ub, &ob).await.unwrap();
    submit(ctx, |p| op.encode(p, n_tok as u32));
    let got = read_f32(ctx, &ob, 0, cap).await.unwrap();
    ctx.check().unwrap();
    got
}

#[derive(Clone, Copy, Debug)]
struct Case {
    act: Activation,
    n_ff: usize,
    n_tok: usize,
    in_place: bool,
}

/// Odd and model widths, one to thirteen tokens, out of place and in place.
fn cases(act: Activation) -> impl Iterator<Item = Case> {
    [100usize, 896, 4864]
        .into_iter()
        .flat_map(move |n_ff| [1usize, 3, 13].into_iter().flat_map(move |n_tok| [false, true].map(|in_place| Case { act, n_ff, n_tok, in_place })))
}

async fn run(ctx: &GpuContext, Case { act, n_ff, n_tok, in_place }: Case) {
    let mut rng = TestRng::new((n_ff * 31 + n_tok) as u64);
    let used = n_tok * n_ff;
    let gate: Vec<f32> = rng.vec(used).iter().map(|v| v * 6.0).collect();
    let up = rng.vec(used);
    let got = glu(ctx, act, n_ff, &gate, &up, in_place).await;
    let f = act_fn(act);
    let want: Vec<f32> = gate.iter().zip(&up).map(|(&g, &u)| f(g) * u).collect();
    let e = nmse(&got[..used], &want);
    assert!(e <= NMSE_F32, "nmse {e}");
    assert_untouched(&got[used..], "wrote past n_tok");
}

/// Gates from ±1e30 to ±1e-20 through both activations: finite, within 1e-6 relative.
async fn extreme_inputs(ctx: &GpuContext, act: Activation) {
    let gate = vec![-1e30f32, -1e4, -100.0, -30.0, -1e-20, 0.0, 1e-20, 30.0, 100.0, 1e4, 1e30, -88.0, 88.0];
    let up = vec![1.0f32; gate.len()];
    let got = glu(ctx, act, gate.len(), &gate, &up, false).await;
    let f = act_fn(act);
    for (i, &g) in gate.iter().enumerate() {
        let want = f(g);
        assert!(got[i].is_finite(), "{act:?}({g}) = {}", got[i]);
        let tol = 1e-6 * want.abs().max(1.0);
        assert!((got[i] - want).abs() <= tol, "{act:?}({g}): got {} want {want}", got[i]);
    }
}

flint_gpu::op_tests! { run;
    glu_silu => cases(Activation::Silu),
    glu_gelu_tanh => cases(Activation::GeluTanh),
}

flint_gpu::op_tests! { extreme_inputs;
    glu_extreme_inputs_stay_finite => [Activation::Silu, Activation::GeluTanh],
}

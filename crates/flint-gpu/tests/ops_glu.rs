//! The gated activation against flint_core's reference: SiLU and GELU-tanh, out of place and
//! in place (into gate), odd widths, and extreme inputs that must stay finite.

use flint_core::arch::Activation;
use flint_core::reference::ops;
use flint_gpu::buffer::{read_f32, storage_init};
use flint_gpu::ops::glu::{Glu, GluDesc};
use flint_gpu::ops::Batch;
use flint_gpu::pipeline::PipelineCache;
use flint_gpu::testing::{nmse, TestRng, NMSE_F32};
use flint_gpu::GpuContext;

const MAX_TOKENS: u32 = 16;
const SENTINEL: f32 = -12345.5;

fn submit(ctx: &GpuContext, f: impl FnOnce(&mut wgpu::ComputePass<'_>)) {
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    {
        let mut pass = enc.begin_compute_pass(&Default::default());
        f(&mut pass);
    }
    ctx.queue.submit([enc.finish()]);
}

fn act_fn(act: Activation) -> fn(f32) -> f32 {
    match act {
        Activation::Silu => ops::silu,
        Activation::GeluTanh => ops::gelu_tanh,
    }
}

/// Runs act(gate)·up on the GPU; returns the whole output buffer (sentinels included).
async fn run(ctx: &GpuContext, cache: &PipelineCache, act: Activation, n_ff: usize, gate: &[f32], up: &[f32], in_place: bool) -> Vec<f32> {
    let n_tok = gate.len() / n_ff;
    let cap = MAX_TOKENS as usize * n_ff;
    let pad = |v: &[f32]| {
        let mut b = v.to_vec();
        b.resize(cap, SENTINEL);
        storage_init(ctx, "buf", bytemuck::cast_slice(&b)).unwrap()
    };
    let (gb, ub) = (pad(gate), pad(up));
    let ob = if in_place { gb.clone() } else { pad(&[]) };
    let batch = Batch::new(ctx, MAX_TOKENS, 1, 1, 16).unwrap();
    batch.write(ctx, &vec![0; n_tok], &vec![0; n_tok], &vec![0; n_tok], &[]);
    let op = Glu::new(ctx, cache, &batch, GluDesc { act, n_ff: n_ff as u32 }, &gb, &ub, &ob).await.unwrap();
    submit(ctx, |p| op.encode(p, n_tok as u32));
    let got = read_f32(ctx, &ob, 0, cap).await.unwrap();
    ctx.check().unwrap();
    got
}

#[test]
fn glu_matches_reference() {
    flint_gpu::gpu_test!(ctx => {
        let cache = PipelineCache::new();
        for act in [Activation::Silu, Activation::GeluTanh] {
            for &n_ff in &[100usize, 896, 4864] {
                for &n_tok in &[1usize, 3, 13] {
                    for in_place in [false, true] {
                        let mut rng = TestRng::new((n_ff * 31 + n_tok) as u64);
                        let used = n_tok * n_ff;
                        let gate: Vec<f32> = rng.vec(used).iter().map(|v| v * 6.0).collect();
                        let up = rng.vec(used);
                        let got = run(ctx, &cache, act, n_ff, &gate, &up, in_place).await;
                        let f = act_fn(act);
                        let want: Vec<f32> = gate.iter().zip(&up).map(|(&g, &u)| f(g) * u).collect();
                        let e = nmse(&got[..used], &want);
                        let label = format!("{act:?} n_ff {n_ff} n_tok {n_tok} in_place {in_place}");
                        assert!(e <= NMSE_F32, "{label}: nmse {e}");
                        assert!(got[used..].iter().all(|&v| v == SENTINEL), "{label}: wrote past n_tok");
                    }
                }
            }
        }
    });
}

#[test]
fn glu_extreme_inputs_stay_finite() {
    flint_gpu::gpu_test!(ctx => {
        let cache = PipelineCache::new();
        let gate = vec![-1e30f32, -1e4, -100.0, -30.0, -1e-20, 0.0, 1e-20, 30.0, 100.0, 1e4, 1e30, -88.0, 88.0];
        let up = vec![1.0f32; gate.len()];
        for act in [Activation::Silu, Activation::GeluTanh] {
            let got = run(ctx, &cache, act, gate.len(), &gate, &up, false).await;
            let f = act_fn(act);
            for (i, &g) in gate.iter().enumerate() {
                let want = f(g);
                assert!(got[i].is_finite(), "{act:?}({g}) = {}", got[i]);
                let tol = 1e-6 * want.abs().max(1.0);
                assert!((got[i] - want).abs() <= tol, "{act:?}({g}): got {} want {want}", got[i]);
            }
        }
    });
}

//! Times one quantized matmul on the default adapter (wall clock), for kernel tuning:
//!   cargo run --release -p flint-gpu --example matmul_speed -- Q5_0 896 4864 1,8,128 [reps] [fusion]
//! (format, n_in, n_rows, step sizes in tokens, each timed on one op built for the largest; fusion: `norm` folds an RMSNorm in, `glu` stacks as many up
//! rows and ends in SiLU, `glu+norm` both; `+exact` keeps the exact mode's kernels, without
//! the tiled GEMM past 16 tokens on GPUs). Prints milliseconds per dispatch, the bytes it moves per
//! second (weights, activations and outputs, each once) and TFLOP/s; the first
//! dispatch (pipeline warm-up) is not timed, but printed apart with the pipeline's creation
//! (with an empty `MESA_SHADER_CACHE_DIR`, that is the kernel's compile time on lavapipe).

use flint_core::quant::QuantType;
use flint_gpu::buffer::{read_f32, storage_init};
use flint_gpu::ops::matmul::{Matmul, MatmulDesc};
use flint_gpu::ops::Batch;
use flint_gpu::pipeline::PipelineCache;
use flint_gpu::testing::{f16_nearest, random_quant, TestRng};
use flint_gpu::GpuContext;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let ty = QuantType::ALL.into_iter().find(|t| t.to_string().eq_ignore_ascii_case(args.first().map_or("Q5_0", |s| s))).expect("unknown format");
    let num = |i: usize, d: u32| args.get(i).map_or(d, |s| s.parse().expect("a number"));
    let (n_in, n_rows, reps) = (num(1, 896), num(2, 4864), num(4, 3));
    let steps: Vec<u32> = args.get(3).map_or("128", |s| s.as_str()).split(',').map(|s| s.parse().expect("token counts")).collect();
    let n_tok = *steps.iter().max().expect("a token count");
    let fusion = args.get(5).map_or("", |s| s.as_str());
    let (glu, norm, exact) = (fusion.contains("glu"), fusion.contains("norm"), fusion.contains("exact"));
    futures::executor::block_on(async {
        let ctx = GpuContext::new().await.expect("adapter");
        let cache = PipelineCache::for_context(&ctx);
        let batch = Batch::new(&ctx, n_tok, 1, 1, 16).unwrap();
        let pos: Vec<u32> = (0..n_tok).collect();
        batch.write(&ctx, &vec![0; n_tok as usize], &pos, &vec![0; n_tok as usize], &[&[0]]);
        let mut rng = TestRng::new(7);
        let w_rows = if glu { 2 * n_rows } else { n_rows };
        let raw = random_quant(ty, (n_in * w_rows) as usize, &mut rng, f16_nearest);
        let g = storage_init(&ctx, "norm_w", bytemuck::cast_slice(&rng.vec(n_in as usize))).unwrap();
        let w = storage_init(&ctx, "w", &flint_gpu::weights::layout::to_gpu(ty, n_in as usize, &raw)).unwrap();
        let x = storage_init(&ctx, "x", bytemuck::cast_slice(&rng.vec((n_in * n_tok) as usize))).unwrap();
        let y = storage_init(&ctx, "y", &vec![0u8; (n_rows * n_tok * 4) as usize]).unwrap();
        let desc = MatmulDesc {
            label: "speed",
            ty,
            n_in,
            n_rows,
            row_offset: 0,
            y_stride: n_rows,
            max_tokens: n_tok,
            accumulate: false,
            ids: None,
            output: if glu { flint_gpu::ops::matmul::Output::Glu(flint_core::arch::Activation::Silu) } else { flint_gpu::ops::matmul::Output::Rows },
            norm: norm.then_some(flint_gpu::ops::matmul::MatmulNorm { w: &g, eps: 1e-6 }),
            exact,
        };
        let t_build = std::time::Instant::now();
        let mm = Matmul::new(&ctx, &cache, &batch.info, &desc, &w, &x, &y, None).await.unwrap();
        let run = |n: u32, n_tok: u32| {
            let mut enc = ctx.device.create_command_encoder(&Default::default());
            for _ in 0..n {
                let mut pass = enc.begin_compute_pass(&Default::default());
                mm.encode(&mut pass, n_tok);
            }
            ctx.queue.submit([enc.finish()]);
        };
        let fusion = if fusion.is_empty() { "plain" } else { fusion };
        // The first step's pipeline is built with the op; a later step's at its first dispatch.
        let mut t_first = t_build;
        for &n_tok in &steps {
            batch.write(&ctx, &vec![0; n_tok as usize], &pos[..n_tok as usize], &vec![0; n_tok as usize], &[&[0]]);
            run(1, n_tok);
            read_f32(&ctx, &y, 0, 1).await.unwrap();
            let first_s = t_first.elapsed().as_secs_f64();
            let t0 = std::time::Instant::now();
            run(reps, n_tok);
            read_f32(&ctx, &y, 0, 1).await.unwrap();
            let ms = t0.elapsed().as_secs_f64() * 1e3 / reps as f64;
            let flops = 2.0 * n_in as f64 * w_rows as f64 * n_tok as f64;
            let bytes = w.size() as f64 + 4.0 * n_tok as f64 * (n_in + n_rows) as f64;
            let (gbs, tflops) = (bytes / (ms * 1e6), flops / (ms * 1e9));
            println!(
                "{ty} {n_in}x{n_rows} x {n_tok} tokens, {fusion} ({:?}) on {}: {ms:.3} ms, {gbs:.1} GB/s, {tflops:.3} TFLOP/s; pipeline + first dispatch {first_s:.1} s",
                mm.shape(n_tok),
                ctx.adapter_name()
            );
            t_first = std::time::Instant::now();
        }
    });
}

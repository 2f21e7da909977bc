//! A two-layer model of Qwen2.5-7B's widths: 3584 wide, 18944 feed-forward, 28 query and 4 KV
//! heads of 128, QKV biases, in Q4_K_M's block formats (Q4_K; Q6_K for attn_v and ffn_down),
//! seeded random weights (`flint_gpu::testing::random_quant`), the tokenizer of the tiny qwen3
//! oracle. Written here, in Rust, to `target/test-models/wide-2l.gguf` (308 MB) with the
//! greedy continuation the GPU gives (`wide-2l.json`: 4 tokens of an 8-token prompt, each
//! with its top-20 logprobs); the browser test (`tests/web/package.test.mjs`) loads the file
//! through the npm package and must give the same. Here the GPU's first logits must match the
//! CPU reference's (NMSE ≤ 1e-5) and its greedy ids the reference's.

mod common;
#[path = "../../flint-core/tests/common/gguf_writer.rs"]
mod gguf_writer;

use std::path::PathBuf;

use flint::{BackendKind, Engine, Event, GenerateParams, Input, LoadOptions, Request, SamplingParams};
use flint_core::gguf::{Array, GgufFile, Value};
use flint_core::quant::{BlockQ4K, BlockQ6K, QuantType};
use flint_gpu::testing::{f16_nearest, random_quant, TestRng};
use futures::StreamExt;
use gguf_writer::{ggml, GgufWriter, TensorSpec, Val};

const N_EMBD: u64 = 3584;
const N_FF: u64 = 18944;
const N_HEAD: u64 = 28;
const N_HEAD_KV: u64 = 4;
const HEAD_DIM: u64 = 128;
const N_LAYER: usize = 2;
/// The prompt: 8 tokens of the tiny qwen3 tokenizer.
const PROMPT: &str = "The capital of France is the city";
const N_GEN: usize = 4;
const TOP: usize = 20;

fn val(v: &Value) -> Val {
    match v {
        Value::U8(x) => Val::u8(*x),
        Value::I8(x) => Val::i8(*x),
        Value::U16(x) => Val::u16(*x),
        Value::I16(x) => Val::i16(*x),
        Value::U32(x) => Val::u32(*x),
        Value::I32(x) => Val::i32(*x),
        Value::F32(x) => Val::f32(*x),
        Value::Bool(x) => Val::bool(*x),
        Value::String(s) => Val::string(s),
        Value::U64(x) => Val::u64(*x),
        Value::I64(x) => Val::i64(*x),
        Value::F64(x) => Val::f64(*x),
        Value::Array(Array::String(v)) => Val::str_array(&v.iter().map(String::as_str).collect::<Vec<_>>()),
        Value::Array(Array::I32(v)) => Val::i32_array(v),
        Value::Array(Array::U32(v)) => Val::u32_array(v),
        Value::Array(Array::F32(v)) => Val::f32_array(v),
        other => panic!("a tokenizer value of an unexpected kind: {other:?}"),
    }
}

/// Random blocks of `ty` (Q4_K or Q6_K) for a [rows, cols] matrix (ggml dims [cols, rows]),
/// their super-block scales divided so that weights are about 1/√cols (random_quant's scales
/// are for short test rows; at these widths they would send the logits into the thousands).
fn matrix(name: &str, cols: u64, rows: u64, ty: QuantType, id: u32, rng: &mut TestRng) -> TensorSpec {
    let mut data = random_quant(ty, (cols * rows) as usize, rng, f16_nearest);
    let shrink = |h: u16, by: f32| half::f16::from_f32(half::f16::from_bits(h).to_f32() / by).to_bits();
    let by = (cols as f32).sqrt() / 2.0;
    for b in data.chunks_exact_mut(ty.block_bytes()) {
        match ty {
            QuantType::Q4K => {
                let mut blk: BlockQ4K = bytemuck::pod_read_unaligned(b);
                (blk.d, blk.dmin) = (shrink(blk.d, by), shrink(blk.dmin, by));
                b.copy_from_slice(bytemuck::bytes_of(&blk));
            }
            QuantType::Q6K => {
                let mut blk: BlockQ6K = bytemuck::pod_read_unaligned(b);
                blk.d = shrink(blk.d, by * 8.0);
                b.copy_from_slice(bytemuck::bytes_of(&blk));
            }
            _ => unreachable!("Q4_K_M's formats"),
        }
    }
    TensorSpec::with_data(name, &[cols, rows], id, data)
}

/// Norm weights near 1 and small biases.
fn vector(name: &str, n: u64, base: f32, rng: &mut TestRng) -> TensorSpec {
    let v: Vec<f32> = rng.vec(n as usize).iter().map(|x| base + 0.1 * x).collect();
    TensorSpec::f32(name, &[n], &v)
}

/// The model file's bytes.
fn wide_model() -> Vec<u8> {
    let vocab = GgufFile::open(common::shared().join("golden/families/qwen3/model.gguf")).unwrap();
    let n_vocab = vocab.tensor("token_embd.weight").unwrap().dims[1];
    let a = "qwen2";
    let mut w = GgufWriter::new()
        .kv("general.architecture", Val::string(a))
        .kv("general.name", Val::string("wide-2l (Qwen2.5-7B widths, 2 layers, random weights)"))
        .kv(&format!("{a}.context_length"), Val::u32(4096))
        .kv(&format!("{a}.embedding_length"), Val::u32(N_EMBD as u32))
        .kv(&format!("{a}.block_count"), Val::u32(N_LAYER as u32))
        .kv(&format!("{a}.feed_forward_length"), Val::u32(N_FF as u32))
        .kv(&format!("{a}.attention.head_count"), Val::u32(N_HEAD as u32))
        .kv(&format!("{a}.attention.head_count_kv"), Val::u32(N_HEAD_KV as u32))
        .kv(&format!("{a}.attention.layer_norm_rms_epsilon"), Val::f32(1e-6))
        .kv(&format!("{a}.rope.freq_base"), Val::f32(1e6));
    for key in vocab.metadata.keys().filter(|k| k.starts_with("tokenizer.") && *k != "tokenizer.chat_template") {
        w = w.kv(key, val(vocab.metadata.get(key).unwrap()));
    }
    let mut rng = TestRng::new(7);
    let (q, kv) = (N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM);
    w = w
        .tensor_spec(matrix("token_embd.weight", N_EMBD, n_vocab, QuantType::Q4K, ggml::Q4_K, &mut rng))
        .tensor_spec(vector("output_norm.weight", N_EMBD, 1.0, &mut rng))
        .tensor_spec(matrix("output.weight", N_EMBD, n_vocab, QuantType::Q6K, ggml::Q6_K, &mut rng));
    for i in 0..N_LAYER {
        let n = |s: &str| format!("blk.{i}.{s}");
        let (q4, q6) = ((QuantType::Q4K, ggml::Q4_K), (QuantType::Q6K, ggml::Q6_K));
        for (name, cols, rows, (ty, id)) in [
            ("attn_q.weight", N_EMBD, q, q4),
            ("attn_k.weight", N_EMBD, kv, q4),
            ("attn_v.weight", N_EMBD, kv, q6),
            ("attn_output.weight", q, N_EMBD, q4),
            ("ffn_gate.weight", N_EMBD, N_FF, q4),
            ("ffn_up.weight", N_EMBD, N_FF, q4),
            ("ffn_down.weight", N_FF, N_EMBD, q6),
        ] {
            w = w.tensor_spec(matrix(&n(name), cols, rows, ty, id, &mut rng));
        }
        w = w
            .tensor_spec(vector(&n("attn_norm.weight"), N_EMBD, 1.0, &mut rng))
            .tensor_spec(vector(&n("ffn_norm.weight"), N_EMBD, 1.0, &mut rng))
            .tensor_spec(vector(&n("attn_q.bias"), q, 0.0, &mut rng))
            .tensor_spec(vector(&n("attn_k.bias"), kv, 0.0, &mut rng))
            .tensor_spec(vector(&n("attn_v.bias"), kv, 0.0, &mut rng));
    }
    w.finish()
}

/// Each generated token's top logprobs: (token text, logprob), most likely first.
type Tops = Vec<Vec<(String, f32)>>;

/// Greedy tokens of `prompt` with their top logprobs, and the first step's full logits.
fn greedy(engine: &Engine, prompt: &[u32]) -> (Vec<u32>, Tops, Vec<f32>) {
    let sampling = SamplingParams { n_logprobs: TOP, ..SamplingParams::greedy() };
    let params = GenerateParams { max_tokens: Some(N_GEN), sampling, ignore_eos: true, ..Default::default() };
    let mut req = Request::new(Input::Tokens(prompt.to_vec()), params);
    req.logits = true;
    let text = |id: u32| String::from_utf8_lossy(&engine.info().tokenizer.token_bytes(id)).into_owned();
    futures::executor::block_on(async {
        let mut stream = engine.submit(req).unwrap();
        let (mut ids, mut tops, mut first) = (Vec::new(), Vec::new(), None);
        while let Some(ev) = stream.next().await {
            if let Event::Token { id, logprobs, logits, .. } = ev.unwrap() {
                ids.push(id);
                tops.push(logprobs.unwrap().top.iter().map(|&(t, l)| (text(t), l)).collect());
                first.get_or_insert(logits.unwrap());
            }
        }
        (ids, tops, first.unwrap())
    })
}

fn out_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/test-models");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn two_layers_of_7b_widths_match_the_cpu_reference_and_leave_the_browser_its_oracle() {
    if flint_gpu::testing::context().is_none() {
        return;
    }
    let t0 = std::time::Instant::now();
    let path = out_dir().join("wide-2l.gguf");
    let bytes = wide_model();
    std::fs::write(&path, &bytes).unwrap();
    eprintln!("wrote {} ({} bytes) in {:.1}s", path.display(), bytes.len(), t0.elapsed().as_secs_f64());
    drop(bytes);

    let load = |backend| Engine::load_path(&path, &LoadOptions { backend, n_ctx: 256, ..LoadOptions::default() }).unwrap();
    let gpu = load(BackendKind::Gpu);
    let prompt = gpu.tokenize_raw(PROMPT).unwrap();
    assert_eq!(prompt.len(), 8, "{prompt:?}");
    let (ids, tops, logits) = greedy(&gpu, &prompt);
    drop(gpu);
    let cpu = load(BackendKind::Cpu);
    let (cpu_ids, _, cpu_logits) = greedy(&cpu, &prompt);
    let e = common::nmse(&logits, &cpu_logits);
    eprintln!("7B widths, 2 layers: GPU against the CPU reference NMSE {e:.2e}, ids {ids:?} in {:.1}s", t0.elapsed().as_secs_f64());
    assert!(e <= common::MAX_NMSE, "NMSE {e:e}");
    assert_eq!(ids, cpu_ids);
    assert!(tops.iter().all(|t| t.len() == TOP && t.iter().all(|(_, l)| l.is_finite())));
    let oracle = serde_json::json!({
        "model": "wide-2l.gguf",
        "prompt": PROMPT,
        "prompt_token_ids": prompt,
        "greedy_token_ids": ids,
        "top_logprobs": tops.iter().map(|t| t.iter().map(|(s, l)| serde_json::json!({"token": s, "logprob": l})).collect::<Vec<_>>()).collect::<Vec<_>>(),
    });
    std::fs::write(out_dir().join("wide-2l.json"), serde_json::to_string_pretty(&oracle).unwrap()).unwrap();
}

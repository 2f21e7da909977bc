//! NaN logits (a corrupted model file, as a broken driver would give) end the request with a
//! clear error naming the generated token, instead of emitting one; on the CPU reference and
//! on the GPU, whose sampler detects them on the device. A request beside it is unaffected,
//! and the engine goes on serving.
//!
//! The file is the phi3 oracle model (its output matrix is not the embedding) with one token's
//! embedding row set to NaN: that token is the oracle's third greedy token for prompt 1, so
//! the first three tokens come out as the reference's and the logits after feeding the third
//! are NaN. Prompt 2, which never meets that token, runs in the same steps.

mod common;

use common::{ids, json, shared};
use flint::{BackendKind, Engine, EngineError, Event, GenerateParams, Input, LoadOptions, Request, SamplingParams};
use flint_core::gguf::GgufFile;
use flint_core::quant::QuantType;
use futures::StreamExt;

/// Runs each (prompt, n) greedily at once: each one's ids, then the error if one ended it.
fn run(engine: &Engine, jobs: &[(&[u32], usize)]) -> Vec<(Vec<u32>, Option<EngineError>)> {
    futures::executor::block_on(async {
        let mut streams = futures::stream::SelectAll::new();
        for (i, &(prompt, n)) in jobs.iter().enumerate() {
            let params = GenerateParams { max_tokens: Some(n), sampling: SamplingParams::greedy(), ignore_eos: true, ..Default::default() };
            streams.push(engine.submit(Request::new(Input::Tokens(prompt.to_vec()), params)).unwrap().map(move |e| (i, e)));
        }
        let mut outs: Vec<(Vec<u32>, Option<EngineError>)> = jobs.iter().map(|_| (Vec::new(), None)).collect();
        let mut ended = vec![false; jobs.len()];
        while let Some((i, ev)) = streams.next().await {
            match ev {
                Ok(Event::Token { id, .. }) => outs[i].0.push(id),
                Ok(Event::Done { .. }) => ended[i] = true,
                Err(e) => {
                    outs[i].1 = Some(e);
                    ended[i] = true;
                }
            }
        }
        assert!(ended.iter().all(|&e| e), "a stream ended without Done or an error");
        outs
    })
}

#[test]
fn nan_logits_fail_the_request_naming_the_token() {
    let dir = shared().join("golden/families/phi3");
    let reference = json(dir.join("1.json"));
    let (prompt, greedy) = (ids(&reference["prompt_token_ids"]), ids(&reference["greedy_token_ids"]));
    let poison = greedy[2];
    assert!(!prompt.contains(&poison) && !greedy[..2].contains(&poison), "the poisoned token must first appear as greedy token 3");
    let other = json(dir.join("2.json"));
    let (prompt2, greedy2) = (ids(&other["prompt_token_ids"]), ids(&other["greedy_token_ids"]));
    assert!(!prompt2.contains(&poison) && !greedy2.contains(&poison), "prompt 2 must never meet the poisoned token");

    let mut bytes = std::fs::read(dir.join("model.gguf")).unwrap();
    let file = GgufFile::from_bytes(bytes.clone()).unwrap();
    let t = file.tensor("token_embd.weight").unwrap().clone();
    assert_eq!(t.ty, QuantType::F16, "the oracle's embedding is F16");
    let row_bytes = (t.n_bytes / t.n_rows()) as usize;
    let start = (file.data_offset + t.offset) as usize + poison as usize * row_bytes;
    for h in bytes[start..start + row_bytes].chunks_exact_mut(2) {
        h.copy_from_slice(&0x7e00u16.to_le_bytes()); // an f16 NaN
    }
    let path = std::env::temp_dir().join(format!("flint-nan-{}.gguf", std::process::id()));
    std::fs::write(&path, &bytes).unwrap();

    let mut backends = vec![BackendKind::Cpu];
    if flint_gpu::testing::context().is_some() {
        backends.push(BackendKind::Gpu);
    }
    for backend in backends {
        let engine = Engine::load_path(&path, &LoadOptions { backend, n_ctx: 512, ..LoadOptions::default() }).unwrap();
        let mut outs = run(&engine, &[(&prompt, 32), (&prompt2, 16)]).into_iter();
        let ((got, err), (got2, err2)) = (outs.next().unwrap(), outs.next().unwrap());
        assert_eq!(got, greedy[..3], "{backend:?}: the tokens before the NaN logits");
        let e = err.unwrap_or_else(|| panic!("{backend:?}: NaN logits gave a token"));
        let msg = e.to_string();
        assert!(msg.contains("generated token 4") && msg.contains("NaN"), "{backend:?}: {msg}");
        eprintln!("{backend:?}: {msg}");
        // The request beside it completes; the oracle has no near tie in its first 16 steps.
        assert!(err2.is_none(), "{backend:?}: {err2:?}");
        assert_eq!(got2, greedy2[..16], "{backend:?}: the request beside the failed one");
        // The engine goes on: the same prompt stopped before the poisoned token completes,
        // from a cache that kept nothing of the failed request.
        let (again, err) = run(&engine, &[(&prompt, 3)]).remove(0);
        assert!(err.is_none(), "{backend:?}: {err:?}");
        assert_eq!(again, greedy[..3], "{backend:?}: after the failure");
    }
    let _ = std::fs::remove_file(&path);
}

//! A GPU device lost mid-generation (destroyed through the engine's fault-injection hook, as a
//! driver reset would): both running requests end with the typed device-lost error within
//! 2 s, and the next request opens a new device, loads the weights again and gives the same
//! greedy ids as before the loss, without any prefix cached on the dead device; so does an
//! explicit `reload()` after a loss while idle. The same with the model's layers split over
//! two lavapipe devices, the second of which is lost. Its own test binary: the device it
//! destroys is the process's.

mod common;

use std::time::{Duration, Instant};

use common::{check_greedy, ids, json, shared};
use flint::{BackendError, BackendKind, Engine, EngineError, Event, GenerateParams, Input, LoadOptions, Request, SamplingParams, Summary};
use futures::StreamExt;

fn greedy(prompt: &[u32], n: usize) -> Request {
    let params = GenerateParams { max_tokens: Some(n), sampling: SamplingParams::greedy(), ignore_eos: true, ..Default::default() };
    Request::new(Input::Tokens(prompt.to_vec()), params)
}

/// One greedy request to its end: its ids and summary.
fn complete(engine: &Engine, prompt: &[u32], n: usize) -> (Vec<u32>, Summary) {
    futures::executor::block_on(async {
        let mut h = engine.submit(greedy(prompt, n)).unwrap();
        let mut got = Vec::new();
        while let Some(ev) = h.next().await {
            match ev.unwrap() {
                Event::Token { id, .. } => got.push(id),
                Event::Done { summary, .. } => return (got, summary),
            }
        }
        panic!("the stream ended without Done");
    })
}

#[test]
fn a_lost_device_fails_running_requests_and_the_next_request_reloads() {
    lost_device_drill(None, 0);
}

/// Split over two devices of one adapter, the second (the head's) lost.
#[test]
fn a_lost_device_under_a_layer_split_fails_running_requests_and_the_next_request_reloads() {
    lost_device_drill(Some("llvmpipe,llvmpipe"), 1);
}

/// Loads the tiny qwen3 on `device` and loses the device of part `part` mid-generation.
fn lost_device_drill(device: Option<&str>, part: usize) {
    if flint_gpu::testing::context().is_none() {
        return;
    }
    let dir = shared().join("golden/families/qwen3");
    let opts = LoadOptions { backend: BackendKind::Gpu, n_ctx: 512, device: device.map(str::to_string), ..LoadOptions::default() };
    let engine = Engine::load_path(&dir.join("model.gguf"), &opts).unwrap();
    assert_eq!(engine.info().parts.len(), part + 1, "{:?}", engine.info().parts);
    // Every step kind compiled first: a step that compiles a kernel (seconds on lavapipe when
    // the other test compiles too) would hold the loss back until it ends.
    futures::executor::block_on(engine.warm_up()).unwrap();
    let (r1, r2) = (json(dir.join("1.json")), json(dir.join("2.json")));
    let (p1, p2) = (ids(&r1["prompt_token_ids"]), ids(&r2["prompt_token_ids"]));
    let (before, _) = complete(&engine, &p1, 32);
    check_greedy("before the loss", &before, &r1);

    // Two long requests; once both stream, the device goes.
    let n_long = 300;
    let lost_after = futures::executor::block_on(async {
        let mut streams = futures::stream::SelectAll::new();
        for (i, p) in [&p1, &p2].into_iter().enumerate() {
            streams.push(engine.submit(greedy(p, n_long)).unwrap().map(move |e| (i, e)));
        }
        let mut tokens = [0usize; 2];
        let mut errors: [Option<EngineError>; 2] = [None, None];
        let mut lost_at: Option<Instant> = None;
        let mut last_error = Duration::ZERO;
        while let Some((i, ev)) = streams.next().await {
            match ev {
                Ok(Event::Token { .. }) => tokens[i] += 1,
                Ok(Event::Done { summary, .. }) => panic!("request {i} finished ({:?}) after the device was lost", summary.finish_reason),
                Err(e) => {
                    last_error = lost_at.expect("an error before the device was lost").elapsed();
                    errors[i] = Some(e);
                }
            }
            // Once both have decoded together (a step of two sequences has run, so the step in
            // flight at the loss compiles no kernel on lavapipe), the device goes.
            if lost_at.is_none() && tokens.iter().all(|&n| n > 2) {
                engine.lose_device_of(part);
                lost_at = Some(Instant::now());
            }
        }
        for (i, e) in errors.iter().enumerate() {
            let e = e.as_ref().unwrap_or_else(|| panic!("request {i} ended without an error"));
            assert!(matches!(e.backend(), Some(BackendError::DeviceLost { .. })), "request {i}: {e:?}");
            assert!(e.to_string().starts_with("the GPU device was lost"), "{e}");
            assert!(tokens[i] < n_long, "request {i} ran to its end");
        }
        eprintln!("device lost after {tokens:?} tokens; both requests failed within {last_error:?}");
        last_error
    });
    assert!(lost_after <= Duration::from_secs(2), "the requests failed {lost_after:?} after the loss");

    // The next request reloads on a new device: the same ids, nothing cached from the old one.
    let t0 = Instant::now();
    let (after, summary) = complete(&engine, &p1, 32);
    eprintln!("recovered (new device, weights reloaded) and completed in {:?}", t0.elapsed());
    assert_eq!(after, before, "greedy ids after the reload differ from before the loss");
    assert_eq!(summary.cached_prompt_tokens, 0, "a prefix cached on the lost device was reused");
    // And the engine keeps serving.
    let (again, summary) = complete(&engine, &p1, 8);
    assert_eq!(again, before[..8]);
    assert!(summary.cached_prompt_tokens > 0 || p1.len() < 16, "prefix reuse works again after the reload");

    // A loss while idle, then an explicit reload: the same ids again.
    engine.lose_device_of(part);
    futures::executor::block_on(engine.reload()).unwrap();
    let (reloaded, summary) = complete(&engine, &p1, 32);
    assert_eq!(reloaded, before, "greedy ids after reload() differ");
    assert_eq!(summary.cached_prompt_tokens, 0);
}

//! Constrained decoding end to end on the tiny random-weight qwen3 of ../shared/golden/families
//! (whatever its weights draw, a constrained reply must be valid): JSON-schema replies that
//! validate (an independent validator), regex, choice, GBNF and Lark replies that match,
//! several choices each held to the grammar, constrained and free requests in the same steps
//! (the free one unchanged), speculation (its drafts cut to what the grammar allows) giving
//! the tokens a plain run gives, a model split over two devices (masks computed before the
//! step, not while its forward pass runs) giving them too, and bad constraints refused before
//! any work.

use flint::{BackendKind, Constrained, Engine, EngineError, Event, FinishReason, GenerateParams, Grammar, Input, LoadOptions, Request};
use flint_core::sampling::SamplingParams;
use flint_core::spec::{SpecConfig, SpecKind};
use serde_json::{json, Value};

fn load(spec: SpecConfig) -> Option<Engine> {
    flint_gpu::testing::context()?;
    let path = flint_core::testing::shared_dir().join("golden/families/qwen3/model.gguf");
    Some(Engine::load_path(&path, &LoadOptions { backend: BackendKind::Gpu, n_ctx: 512, spec, ..LoadOptions::exact() }).unwrap())
}

/// A small schema whose replies are bounded (no free strings, bounded numbers and arrays).
fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "n": {"type": "integer", "minimum": -5, "maximum": 99},
            "color": {"enum": ["red", "green", "blue"]},
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}
        },
        "required": ["ok", "n", "color"],
        "additionalProperties": false
    })
}

fn request(grammar: Grammar, n: usize, seed: u64, temperature: f32) -> Request {
    let sampling = SamplingParams { temperature, seed: Some(seed), ..SamplingParams::default() };
    let params = GenerateParams { max_tokens: Some(300), sampling, ..Default::default() };
    let mut r = Request::new(Input::Text("Answer in JSON:".into()), params);
    r.n = n;
    r.constraint = Some(Constrained { grammar, field: "test" });
    r
}

/// Each choice's text, finish reason and token ids.
fn run(engine: &Engine, reqs: Vec<Request>) -> Vec<Vec<(String, FinishReason, Vec<u32>)>> {
    let handles: Vec<_> = reqs.into_iter().map(|r| (r.n, engine.submit(r).unwrap())).collect();
    futures::executor::block_on(async {
        let mut outs = Vec::new();
        for (n, mut h) in handles {
            let mut out = vec![(String::new(), FinishReason::Abort, Vec::new()); n];
            while let Some(ev) = futures::StreamExt::next(&mut h).await {
                match ev.unwrap() {
                    Event::Token { choice, id, text, .. } => {
                        out[choice].0.push_str(&text);
                        out[choice].2.push(id);
                    }
                    Event::Done { choice, summary, text, .. } => {
                        out[choice].0.push_str(&text);
                        out[choice].1 = summary.finish_reason;
                    }
                }
            }
            outs.push(out);
        }
        outs
    })
}

#[test]
fn constrained_replies_are_valid_whatever_the_weights_draw() {
    let Some(engine) = load(SpecConfig::default()) else { return };
    let validator = jsonschema::validator_for(&schema()).unwrap();
    let (rx, choices) = ("[a-c]{2,4}-[0-9]{1,3}", vec!["alpha".to_string(), "beta gamma".into(), "δ".into()]);
    let reqs = vec![
        request(Grammar::JsonSchema(schema()), 4, 11, 1.0),
        request(Grammar::JsonSchema(schema()), 1, 0, 0.0),
        request(Grammar::JsonObject, 2, 5, 0.8),
        request(Grammar::Regex(rx.into()), 3, 7, 1.0),
        request(Grammar::Choice(choices.clone()), 3, 9, 1.0),
        request(Grammar::from_text("root ::= (\"yes\" | \"no\") (\",\" [0-9])?"), 2, 3, 1.0),
        request(Grammar::from_text("start: \"[\" NUM (\",\" NUM){0,3} \"]\"\nNUM: /[0-9]{1,2}/"), 2, 4, 1.0),
    ];
    let outs = run(&engine, reqs);
    let full = |re: &str| regex::Regex::new(&format!("^(?:{re})$")).unwrap();
    for (i, out) in outs.iter().enumerate() {
        for (c, (text, finish, _)) in out.iter().enumerate() {
            let label = format!("request {i} choice {c}: {text:?}");
            if i == 2 && *finish == FinishReason::Length {
                // `json_object` allows free strings, which random weights need not close.
                assert!(text.starts_with('{'), "{label}");
                continue;
            }
            assert_eq!(*finish, FinishReason::Stop, "{label}");
            match i {
                0 | 1 => {
                    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{label}: {e}"));
                    assert!(validator.is_valid(&v), "{label}");
                }
                2 => assert!(serde_json::from_str::<Value>(text).unwrap_or_else(|e| panic!("{label}: {e}")).is_object(), "{label}"),
                3 => assert!(full(rx).is_match(text), "{label}"),
                4 => assert!(choices.contains(text), "{label}"),
                5 => assert!(full("(yes|no)(,[0-9])?").is_match(text), "{label}"),
                _ => assert!(full(r"\[[0-9]{1,2}(,[0-9]{1,2}){0,3}\]").is_match(text), "{label}"),
            }
        }
    }
    // Sampled choices of one request differ somewhere (each is held to the grammar on its own).
    let texts: std::collections::HashSet<&str> = outs[0].iter().map(|c| c.0.as_str()).collect();
    assert!(texts.len() > 1, "four sampled choices all gave {texts:?}");
}

#[test]
fn free_requests_beside_constrained_ones_are_unchanged_and_speculation_changes_nothing() {
    let Some(engine) = load(SpecConfig::default()) else { return };
    let free = |seed| {
        let sampling = SamplingParams { temperature: 0.9, seed: Some(seed), ..SamplingParams::default() };
        Request::new(Input::Text("Once upon a time".into()), GenerateParams { max_tokens: Some(24), sampling, ignore_eos: true, ..Default::default() })
    };
    let alone = run(&engine, vec![free(21)]);
    let beside = run(&engine, vec![free(21), request(Grammar::JsonSchema(schema()), 2, 1, 1.0)]);
    assert_eq!(alone[0][0].2, beside[0][0].2, "a free request's tokens changed beside a constrained one");

    // Greedy constrained replies: the same tokens with n-gram speculation on.
    let greedy = || vec![request(Grammar::JsonSchema(schema()), 1, 0, 0.0), request(Grammar::Regex("(ab|abc){3,6}".into()), 1, 0, 0.0)];
    let plain = run(&engine, greedy());
    drop(engine);
    let spec = SpecConfig { kind: SpecKind::Ngram, draft_min: 1, ..SpecConfig::default() };
    let Some(engine) = load(spec) else { return };
    let speculated = run(&engine, greedy());
    for (p, s) in plain.iter().zip(&speculated) {
        assert_eq!(p[0].2, s[0].2, "speculation changed a constrained reply: {:?} vs {:?}", p[0].0, s[0].0);
    }
    let stats = futures::executor::block_on(engine.stats()).unwrap();
    eprintln!("speculation: {} drafted, {} accepted", stats.spec.drafted, stats.spec.accepted);
    drop(engine);

    // Split over two devices the step is one submission per part, masks first: the same tokens.
    let path = flint_core::testing::shared_dir().join("golden/families/qwen3/model.gguf");
    let opts = LoadOptions { backend: BackendKind::Gpu, n_ctx: 512, device: Some("llvmpipe,llvmpipe".into()), ..LoadOptions::exact() };
    let split = Engine::load_path(&path, &opts).unwrap();
    assert_eq!(split.info().parts.len(), 2);
    for (p, s) in plain.iter().zip(&run(&split, greedy())) {
        assert_eq!(p[0].2, s[0].2, "a split model changed a constrained reply: {:?} vs {:?}", p[0].0, s[0].0);
    }
}

#[test]
fn forced_tokens_are_fed_without_sampling_where_the_engine_verifies_drafts() {
    let grammar = || Grammar::from_text("start: \"The answer is \" (\"yes\" | \"no\") \", and that is final.\"");
    let full = regex::Regex::new("^The answer is (yes|no), and that is final\\.$").unwrap();
    let mut steps = Vec::new();
    // As the server and the npm package load it (predictions on: draft rows to verify with).
    for spec in [SpecConfig::default(), SpecConfig { predictions: true, ..SpecConfig::default() }] {
        let Some(engine) = load(spec) else { return };
        let before = futures::executor::block_on(engine.stats()).unwrap().steps;
        let out = run(&engine, vec![request(grammar(), 1, 2, 1.0)]);
        let (text, finish, ids) = &out[0][0];
        assert!(full.is_match(text) && *finish == FinishReason::Stop, "{text:?} {finish:?}");
        let stats = futures::executor::block_on(engine.stats()).unwrap();
        assert_eq!((stats.spec.drafted, stats.spec.accepted), (0, 0), "forced tokens are not counted as drafts");
        steps.push((stats.steps - before, ids.len() as u64));
    }
    // Plainly, one step per token after the prompt's (the same prompt steps in both); fast-
    // forwarded, a forced run of tokens takes one step: most of the reply's steps go.
    let ((plain, plain_tokens), (ff, ff_tokens)) = (steps[0], steps[1]);
    eprintln!("plain: {plain} steps for {plain_tokens} tokens; fast-forward: {ff} steps for {ff_tokens} tokens");
    assert!(plain >= plain_tokens && plain - ff >= ff_tokens / 2, "{steps:?}");
}

#[test]
fn bad_constraints_are_refused_before_any_work() {
    let Some(engine) = load(SpecConfig::default()) else { return };
    for grammar in [
        Grammar::JsonSchema(json!({"type": "array", "uniqueItems": true})),
        Grammar::JsonSchema(json!({"type": "string", "format": "no-such-format"})),
        Grammar::Gbnf("root ::= missing".into()),
        Grammar::Lark("start: (\"a\"".into()),
        Grammar::Regex("[".into()),
        Grammar::Choice(vec![]),
    ] {
        match engine.submit(request(grammar.clone(), 1, 0, 0.0)) {
            Err(EngineError::Constraint { field: "test", source }) => eprintln!("{grammar:?}: {source}"),
            Err(e) => panic!("{grammar:?}: {e}"),
            Ok(_) => panic!("{grammar:?} was accepted"),
        }
    }
}

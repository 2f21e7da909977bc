//! A request as the JS package sends it: OpenAI's field names and defaults (temperature 1,
//! top_p 1, no top-k, no penalties), validated by the engine with vLLM's ranges.

use std::collections::BTreeMap;

use serde::Deserialize;

use flint::{GenerateParams, Input, SamplingParams};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// Raw completion: tokenized as is (special tokens parsed, BOS per the model).
    pub prompt: Option<String>,
    /// Chat: rendered with the model's template.
    pub messages: Option<Vec<serde_json::Value>>,
    pub add_generation_prompt: Option<bool>,
    pub max_tokens: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i32>,
    pub min_p: Option<f32>,
    pub seed: Option<i64>,
    pub stop: Option<Vec<String>>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub repeat_last_n: Option<i32>,
    /// Token id (as a string key, as in OpenAI's API) → bias.
    pub logit_bias: Option<BTreeMap<String, f32>>,
    /// `logprobs: true` reports each token's log-probability with `top_logprobs`
    /// alternatives (at least one: the engine's smallest request).
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<usize>,
    /// Choices from the same prompt (sharing its KV blocks), each its own random stream.
    pub n: Option<usize>,
    /// false: no speculative drafts for this request (the engine's setting otherwise).
    pub speculative: Option<bool>,
    /// A predicted output, OpenAI's `{"type": "content", "content": "..."}` or the text alone:
    /// drafts come from it. Speed only; the tokens are the same.
    pub prediction: Option<serde_json::Value>,
}

impl Request {
    /// The engine's parameters; range checks are the engine's (`GenerateParams::validate`).
    pub fn params(&self) -> Result<GenerateParams, String> {
        let max_tokens = match self.max_tokens {
            None => None,
            Some(n) if n >= 1 => Some(n as usize),
            Some(n) => return Err(format!("max_tokens must be at least 1, got {n}")),
        };
        let seed = match self.seed {
            None => None,
            Some(s) if s >= 0 => Some(s as u64),
            Some(s) => return Err(format!("seed must be a non-negative integer, got {s}")),
        };
        let mut logit_bias = Vec::new();
        for (k, &b) in self.logit_bias.iter().flatten() {
            let id: u32 = k.parse().map_err(|_| format!("logit_bias key {k:?} is not a token id"))?;
            logit_bias.push((id, b));
        }
        let n_logprobs = match (self.logprobs, self.top_logprobs) {
            (Some(true), n) => n.unwrap_or(0).max(1),
            (_, Some(n)) if n > 0 => return Err("top_logprobs needs logprobs: true".into()),
            _ => 0,
        };
        let sampling = SamplingParams {
            temperature: self.temperature.unwrap_or(1.0),
            top_k: self.top_k.unwrap_or(0),
            top_p: self.top_p.unwrap_or(1.0),
            min_p: self.min_p.unwrap_or(0.0),
            seed,
            repeat_penalty: self.repetition_penalty.unwrap_or(1.0),
            repeat_last_n: self.repeat_last_n.unwrap_or(64),
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            logit_bias,
            n_logprobs,
        };
        let params = GenerateParams { max_tokens, sampling, stop: self.stop.clone().unwrap_or_default(), ignore_eos: false, speculative: self.speculative };
        params.validate().map_err(|e| e.to_string())?;
        Ok(params)
    }

    /// The engine's request: exactly one of `prompt` and `messages`, and the settings.
    pub fn into_request(self) -> Result<flint::Request, String> {
        let params = self.params()?;
        let prediction = match &self.prediction {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            Some(p) if p.get("type").and_then(|t| t.as_str()) == Some("content") => match p.get("content").and_then(|c| c.as_str()) {
                Some(c) => Some(c.to_string()),
                None => return Err("prediction.content must be a string".into()),
            },
            Some(_) => return Err("prediction must be a string or {\"type\": \"content\", \"content\": string}".into()),
        };
        let input = match (self.prompt, self.messages) {
            (Some(p), None) => Input::Text(p),
            (None, Some(m)) => Input::Chat(m),
            _ => return Err("give exactly one of `prompt` and `messages`".into()),
        };
        let mut req = flint::Request::new(input, params);
        req.n = self.n.unwrap_or(1);
        req.add_generation_prompt = self.add_generation_prompt.unwrap_or(true);
        req.prediction = prediction;
        Ok(req)
    }
}

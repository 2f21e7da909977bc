//! The server's request reading and validation (`flint::openai::parse`, what
//! `/v1/chat/completions` and `/v1/completions` run on every body): the first byte picks the
//! endpoint, the rest is the body. A chat request that parses is then rendered through a real
//! chat template (Qwen3's, which reads tool calls, reasoning and list-valued content), as the
//! engine does before tokenizing, so odd message shapes reach the template too.
#![no_main]

use std::sync::OnceLock;

use flint::openai::{parse, Defaults, Endpoint};
use flint_core::chat::ChatTemplate;
use flint::Input;
use libfuzzer_sys::fuzz_target;

const TEMPLATE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/golden/chat-templates/Qwen-Qwen3-0.6B.jinja");

fn template() -> &'static ChatTemplate {
    static T: OnceLock<ChatTemplate> = OnceLock::new();
    T.get_or_init(|| {
        let src = std::fs::read_to_string(TEMPLATE).unwrap_or_else(|e| panic!("{TEMPLATE}: {e}"));
        ChatTemplate::new(&src, "", "<|im_end|>").expect("Qwen3's template compiles")
    })
}

fuzz_target!(
    init: {
        template();
    },
    |data: &[u8]| {
        let Some((&pick, body)) = data.split_first() else { return };
        let endpoint = if pick & 1 == 0 { Endpoint::Chat } else { Endpoint::Completions };
        let Ok(parsed) = parse(body, endpoint, &Defaults::default()) else { return };
        assert!(parsed.n >= 1 && !parsed.inputs.is_empty(), "a parsed request asks for something");
        for input in &parsed.inputs {
            if let Input::Chat(messages) = input {
                let _ = template().render_json(messages, None, true);
            }
        }
    }
);

//! A GGUF file of arbitrary bytes: the header and metadata reader, the architecture's config,
//! and a tokenizer (and chat template) built from whatever metadata it holds, used on a short
//! text. Any input must end in a value or an error, never a panic, a hang or a huge allocation.
#![no_main]

use flint_core::arch::ModelConfig;
use flint_core::chat::{ChatMessage, ChatTemplate};
use flint_core::gguf::GgufFile;
use flint_core::tokenizer::Tokenizer;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(mut file) = GgufFile::from_bytes(data.to_vec()) else { return };
    if let Ok(cfg) = ModelConfig::from_gguf(&file) {
        let _ = cfg.unfuse(&mut file);
    }
    let Ok(tok) = Tokenizer::from_metadata(&file.metadata) else { return };
    if let Ok(ids) = tok.encode("Hello, world! 123 <|im_start|>", tok.add_bos_default(), true) {
        let _ = tok.decode(&ids, false);
    }
    if let Ok(Some(t)) = ChatTemplate::from_metadata(&file.metadata, &tok) {
        let _ = t.render(&[ChatMessage::new("user", "hi")], true);
    }
});

use serde_json::json;

use super::*;

fn tools(choice: ToolChoice, parallel: bool) -> Tools {
    let spec = |name: &str| json!({"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}});
    let list = ["get_weather", "get_time"].iter().enumerate().map(|(i, n)| Tool::from_openai(i, &spec(n)).unwrap()).collect();
    Tools { tools: list, choice, parallel }
}

/// Feeds `text` one character at a time (the worst split), then finishes.
fn stream(format: ToolFormat, text: &str) -> ToolOut {
    let mut s = format.stream(None, IdMaker::new(7, 0, format));
    let mut all = ToolOut::default();
    for c in text.chars() {
        let o = s.push(1, &c.to_string());
        all.content.push_str(&o.content);
        o.calls.into_iter().for_each(|p| ToolCall::join(&mut all.calls, p));
    }
    let o = s.finish();
    all.content.push_str(&o.content);
    o.calls.into_iter().for_each(|p| ToolCall::join(&mut all.calls, p));
    all
}

fn names_args(out: &ToolOut) -> Vec<(String, serde_json::Value)> {
    out.calls.iter().map(|c| (c.name.clone(), serde_json::from_str(&c.arguments).unwrap())).collect()
}

#[test]
fn openai_tools_and_choices_are_read_and_checked() {
    let t = json!([{"type": "function", "function": {"name": "f", "description": "d"}}]);
    let got = Tools::from_openai(Some(&t), None, None).unwrap().unwrap();
    assert_eq!((got.choice.clone(), got.parallel, got.tools[0].parameters.clone()), (ToolChoice::Auto, true, json!({"type": "object"})));
    let named = json!({"type": "function", "function": {"name": "f"}});
    assert_eq!(Tools::from_openai(Some(&t), Some(&named), Some(false)).unwrap().unwrap().choice, ToolChoice::Named("f".into()));
    assert_eq!(Tools::from_openai(None, Some(&json!("auto")), None), Ok(None));
    assert_eq!(Tools::from_openai(Some(&json!([])), None, None), Ok(None));
    let errors = [
        (Some(json!([{"type": "code"}])), None),
        (Some(json!([{"type": "function", "function": {"name": "bad name"}}])), None),
        (Some(json!([{"type": "function", "function": {"name": "f", "parameters": 3}}])), None),
        (Some(json!({"not": "an array"})), None),
        (Some(t.clone()), Some(json!("sometimes"))),
        (Some(t.clone()), Some(json!({"type": "function", "function": {"name": "g"}}))),
        (None, Some(json!("required"))),
    ];
    for (tools, choice) in errors {
        assert!(Tools::from_openai(tools.as_ref(), choice.as_ref(), None).is_err(), "{tools:?} {choice:?}");
    }
    assert_eq!(
        Tools::from_openai(Some(&t), Some(&json!({"type": "function", "function": {"name": "g"}})), None),
        Err(ToolError::UnknownChoice { name: "g".into() })
    );
}

#[test]
fn hermes_calls_stream_out_of_the_text() {
    let reply = "Let me look.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
    let out = stream(ToolFormat::Hermes, reply);
    assert_eq!(out.content, "Let me look.");
    assert_eq!(names_args(&out), vec![("get_weather".into(), json!({"city": "Paris"})), ("get_time".into(), json!({"city": "Oslo"}))]);
    assert!(out.calls.iter().all(|c| c.id.starts_with("call_") && c.id.len() == 29));
    assert_ne!(out.calls[0].id, out.calls[1].id);
    // Text that only looks like the start of a call comes out whole.
    assert_eq!(stream(ToolFormat::Hermes, "a <tool b <tool_cal").content, "a <tool b <tool_cal");
    assert_eq!(stream(ToolFormat::Hermes, "x<tool_call>{oops</tool_call>y").content, "x<tool_call>{oops</tool_call>y");
    assert_eq!(stream(ToolFormat::Hermes, "x<tool_call>oops</tool_call>y").content, "x<tool_call>oops</tool_call>y");
    // A closing marker inside a string ends nothing.
    let out = stream(ToolFormat::Hermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"s\": \"}</tool_call>\\\"\"}}\n</tool_call>");
    assert_eq!((out.content.as_str(), out.calls[0].arguments.as_str()), ("", "{\"s\": \"}</tool_call>\\\"\"}"));
}

#[test]
fn arguments_stream_as_written_and_join_to_the_call() {
    let reply = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": [1, 2]} }\n</tool_call>";
    let mut s = ToolFormat::Hermes.stream(None, IdMaker::new(7, 0, ToolFormat::Hermes));
    let mut pieces = Vec::new();
    for (i, c) in reply.chars().enumerate() {
        let o = s.push(1, &c.to_string());
        assert_eq!(o.content, "", "at {i}");
        pieces.extend(o.calls);
    }
    pieces.extend(s.finish().calls);
    // The first piece comes as the arguments start, with the id and name; each later one is
    // one character of the arguments, whitespace after them held back and dropped.
    assert_eq!((pieces[0].name.as_str(), pieces[0].arguments.as_str(), pieces[0].index), ("get_weather", "", 0));
    assert!(pieces[1..].iter().all(|p| p.id.is_empty() && p.name.is_empty() && p.index == 0));
    let joined: String = pieces.iter().map(|p| p.arguments.as_str()).collect();
    assert_eq!(joined, "{\"city\": \"Paris\", \"days\": [1, 2]}");
    assert_eq!(pieces.len(), 1 + joined.chars().filter(|c| !c.is_whitespace()).count());
    // Keys in another order: the call comes whole when its object closes.
    let out = stream(ToolFormat::Llama3, "{\"parameters\": {\"city\": \"Rome\"}, \"name\": \"get_weather\"}");
    assert_eq!(names_args(&out), vec![("get_weather".into(), json!({"city": "Rome"}))]);
    // The generic format's list streams too; its `response` is content.
    let mut s = ToolFormat::Generic.stream(None, IdMaker::new(7, 0, ToolFormat::Generic));
    let mut n = 0;
    for c in "{\"tool_calls\": [{\"name\": \"get_time\", \"arguments\": {\"city\": \"Bern\"}}, {\"name\": \"get_time\", \"arguments\": {}}]}".chars() {
        n += s.push(1, &c.to_string()).calls.len();
    }
    assert_eq!((n > 3, s.calls()), (true, 2));
}

#[test]
fn llama3_mistral_and_generic_replies_parse() {
    let out = stream(ToolFormat::Llama3, " <|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}");
    assert_eq!((out.content.as_str(), names_args(&out)), ("", vec![("get_weather".into(), json!({"city": "Rome"}))]));
    assert_eq!(stream(ToolFormat::Llama3, "Sunny, {probably}").content, "Sunny, {probably}");
    let out = stream(
        ToolFormat::Mistral,
        "ok[TOOL_CALLS][{\"name\": \"get_time\", \"arguments\": {\"city\": \"Lima\"}}, {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Quito\"}}]",
    );
    assert_eq!(out.content, "ok");
    assert_eq!(names_args(&out).len(), 2);
    assert!(out.calls.iter().all(|c| c.id.len() == 9 && c.id.chars().all(|c| c.is_ascii_alphanumeric())), "{:?}", out.calls);
    // The trigger as a control token (text empty).
    let mut s = ToolFormat::Mistral.stream(Some(5), IdMaker::new(1, 0, ToolFormat::Mistral));
    assert_eq!(s.push(9, "hi ").content, "hi ");
    assert_eq!(s.push(5, "").content, "");
    let o = s.push(9, "[{\"name\": \"get_time\", \"arguments\": {\"city\": \"X\"}}]");
    assert_eq!((o.calls.len(), o.calls[0].arguments.as_str(), s.calls()), (1, "{\"city\": \"X\"}", 1));
    assert_eq!(s.finish(), ToolOut::default());
    let out = stream(ToolFormat::Generic, "{\"tool_calls\": [{\"name\": \"get_time\", \"arguments\": {\"city\": \"Bern\"}}]}");
    assert_eq!((out.content.as_str(), names_args(&out)), ("", vec![("get_time".into(), json!({"city": "Bern"}))]));
    assert_eq!(stream(ToolFormat::Generic, "{\"response\": \"Hello!\"}").content, "Hello!");
}

#[test]
fn grammars_by_format_and_choice() {
    assert_eq!(ToolFormat::Hermes.grammar(&tools(ToolChoice::None, true), None), None);
    let Some(Grammar::Lark(g)) = ToolFormat::Hermes.grammar(&tools(ToolChoice::Required, true), None) else { panic!() };
    assert!(g.starts_with("start: call (\"\\n\" call)*") && g.contains("\"const\":\"get_time\""), "{g}");
    let Some(Grammar::Lark(g)) = ToolFormat::Hermes.grammar(&tools(ToolChoice::Named("get_time".into()), false), None) else { panic!() };
    assert!(g.contains("get_time") && !g.contains("get_weather"), "a named choice allows only that function: {g}");
    let Some(Grammar::Lark(g)) = ToolFormat::Hermes.grammar(&tools(ToolChoice::Auto, true), None) else { panic!() };
    assert!(g.contains("call_hd[lazy]: TEXT \"<tool_call>\""), "{g}");
    let Some(Grammar::Lark(g)) = ToolFormat::Mistral.grammar(&tools(ToolChoice::Required, false), Some(42)) else { panic!() };
    assert!(g.starts_with("start: <[42]> calls") && g.contains("\"maxItems\":1"), "{g}");
    let Some(Grammar::Lark(g)) = ToolFormat::Generic.grammar(&tools(ToolChoice::Auto, true), None) else { panic!() };
    assert!(g.contains("\"required\":[\"response\"]"), "{g}");
}

#[test]
fn messages_are_shaped_for_the_template() {
    let t = tools(ToolChoice::Auto, true);
    let msgs = vec![
        json!({"role": "user", "content": "weather?"}),
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]}),
        json!({"role": "tool", "tool_call_id": "call_1", "content": "sunny"}),
    ];
    let hermes = ToolFormat::Hermes.messages(&msgs, &t);
    assert_eq!(hermes[1]["tool_calls"][0]["function"]["arguments"], json!({"city": "Paris"}), "arguments as an object for tojson");
    assert_eq!(hermes[2], msgs[2]);
    let generic = ToolFormat::Generic.messages(&msgs, &t);
    assert_eq!(generic[0]["role"], "user", "the tools go before the first user message's text");
    let first = generic[0]["content"].as_str().unwrap();
    assert!(first.contains("get_time") && first.ends_with("weather?"), "{first}");
    assert_eq!(generic[1]["role"], "assistant");
    assert!(generic[1]["content"].as_str().unwrap().contains("tool_calls"));
    assert_eq!(generic[2], json!({"role": "user", "content": "Result of the tool call call_1: sunny"}));
    let with_system = ToolFormat::Generic.messages(&[json!({"role": "system", "content": "Be brief."}), msgs[0].clone()], &t);
    assert!(with_system[0]["content"].as_str().unwrap().starts_with("Be brief.\n\nYou can call"));
}

//! Splits text around special tokens exactly as llama.cpp's `tokenizer_st_partition`: tokens
//! are taken longest text first, each claiming its leftmost non-overlapping occurrences in the
//! text no earlier token claimed. User-defined tokens always split; control and unknown tokens
//! only when special tokens are parsed.

use std::collections::BTreeMap;

use super::vocab::{Attr, Vocab};

/// A piece of the input: raw text for the model, or a special token id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

#[derive(Clone, Copy, Debug)]
struct Special {
    id: u32,
    len: usize,
    /// Control and unknown tokens are matched only with `parse_special`.
    needs_parse_special: bool,
}

/// Sentinel for "no child" in the root's byte table.
const NO_NODE: u32 = 0;

#[derive(Debug, Default)]
struct Node {
    children: Vec<(u8, u32)>,
    /// Index into `SpecialMatcher::order` of the token ending here.
    special: Option<u32>,
}

/// A byte trie over the special tokens' texts, to find every occurrence in one pass.
#[derive(Debug)]
pub(crate) struct SpecialMatcher {
    /// Tokens in llama.cpp's processing order: text length descending, then id.
    order: Vec<Special>,
    /// Root children by first byte (the root has the most children by far).
    root: Box<[u32; 256]>,
    nodes: Vec<Node>,
}

impl SpecialMatcher {
    pub fn new(vocab: &Vocab) -> SpecialMatcher {
        let matchable = Attr::CONTROL.with(Attr::USER_DEFINED).with(Attr::UNKNOWN);
        let mut order: Vec<Special> = (0..vocab.len())
            .filter(|&i| vocab.attrs[i].has(matchable))
            .map(|i| Special { id: i as u32, len: vocab.tokens[i].len(), needs_parse_special: vocab.attrs[i].has(Attr::CONTROL.with(Attr::UNKNOWN)) })
            .collect();
        order.sort_by(|a, b| b.len.cmp(&a.len).then(a.id.cmp(&b.id)));

        let mut m = SpecialMatcher { order: Vec::new(), root: Box::new([NO_NODE; 256]), nodes: vec![Node::default()] };
        for (rank, s) in order.iter().enumerate() {
            let bytes = vocab.tokens[s.id as usize].as_bytes();
            let mut node = 0usize;
            for &b in bytes {
                node = match m.child(node, b) {
                    Some(n) => n,
                    None => m.add_child(node, b),
                };
            }
            // Texts are unique, so each end node holds one token.
            m.nodes[node].special = Some(rank as u32);
        }
        m.order = order;
        m
    }

    fn child(&self, node: usize, b: u8) -> Option<usize> {
        if node == 0 {
            let n = self.root[b as usize];
            return (n != NO_NODE).then_some(n as usize);
        }
        self.nodes[node].children.iter().find(|(c, _)| *c == b).map(|&(_, n)| n as usize)
    }

    fn add_child(&mut self, node: usize, b: u8) -> usize {
        let n = self.nodes.len();
        self.nodes.push(Node::default());
        if node == 0 {
            self.root[b as usize] = n as u32;
        } else {
            self.nodes[node].children.push((b, n as u32));
        }
        n
    }

    /// The text cut into raw fragments and special tokens, in order.
    pub fn partition<'a>(&self, text: &'a str, parse_special: bool) -> Vec<Fragment<'a>> {
        let bytes = text.as_bytes();
        // Every occurrence of every enabled special token, as (rank, start).
        let mut found: Vec<(u32, usize)> = Vec::new();
        for start in 0..bytes.len() {
            let mut node = 0usize;
            for &b in &bytes[start..] {
                match self.child(node, b) {
                    Some(n) => node = n,
                    None => break,
                }
                if let Some(rank) = self.nodes[node].special {
                    if parse_special || !self.order[rank as usize].needs_parse_special {
                        found.push((rank, start));
                    }
                }
            }
        }
        if found.is_empty() {
            return if text.is_empty() { Vec::new() } else { vec![Fragment::Text(text)] };
        }
        // Claim occurrences in llama.cpp's order; a claim must not overlap an earlier one.
        found.sort_unstable();
        let mut claimed: BTreeMap<usize, (usize, u32)> = BTreeMap::new();
        for (rank, start) in found {
            let s = self.order[rank as usize];
            let end = start + s.len;
            let overlaps = claimed.range(..end).next_back().is_some_and(|(_, &(e, _))| e > start);
            if !overlaps {
                claimed.insert(start, (end, s.id));
            }
        }
        let mut out = Vec::with_capacity(2 * claimed.len() + 1);
        let mut pos = 0;
        for (start, (end, id)) in claimed {
            if start > pos {
                out.push(Fragment::Text(&text[pos..start]));
            }
            out.push(Fragment::Token(id));
            pos = end;
        }
        if pos < text.len() {
            out.push(Fragment::Text(&text[pos..]));
        }
        out
    }
}

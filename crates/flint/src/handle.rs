//! A submitted request's handle: its stream of events and its cancellation.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures::channel::mpsc;
use futures::Stream;

use crate::runner::Command;
use crate::{EngineError, Event, EventResult};

/// One submitted request: a stream of its events (every choice's tokens, then a `Done` per
/// choice), and its cancellation. Dropping it cancels the request.
pub struct RequestHandle {
    id: u64,
    events: mpsc::UnboundedReceiver<EventResult>,
    commands: mpsc::UnboundedSender<Command>,
    remaining: usize,
    prompt_tokens: usize,
    finished: bool,
}

impl RequestHandle {
    pub(crate) fn new(
        id: u64,
        events: mpsc::UnboundedReceiver<EventResult>,
        commands: mpsc::UnboundedSender<Command>,
        remaining: usize,
        prompt_tokens: usize,
    ) -> Self {
        RequestHandle { id, events, commands, remaining, prompt_tokens, finished: false }
    }

    /// Stops the request within one step: its choices end with `abort`, its blocks are freed.
    pub fn cancel(&self) {
        let _ = self.commands.unbounded_send(Command::Cancel(self.id));
    }

    /// A handle that cancels its request from elsewhere (a Ctrl-C handler, a disconnect).
    pub fn canceller(&self) -> Canceller {
        Canceller { id: self.id, commands: self.commands.clone() }
    }

    pub fn prompt_tokens(&self) -> usize {
        self.prompt_tokens
    }
}

/// Cancels one request; cloneable and `Send`.
#[derive(Clone)]
pub struct Canceller {
    id: u64,
    commands: mpsc::UnboundedSender<Command>,
}

impl Canceller {
    pub fn cancel(&self) {
        let _ = self.commands.unbounded_send(Command::Cancel(self.id));
    }
}

impl Stream for RequestHandle {
    type Item = EventResult;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<EventResult>> {
        if self.finished {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.events).poll_next(cx) {
            Poll::Ready(Some(ev)) => {
                match &ev {
                    Ok(Event::Done { .. }) => {
                        self.remaining = self.remaining.saturating_sub(1);
                        self.finished = self.remaining == 0;
                    }
                    Err(_) => self.finished = true,
                    _ => {}
                }
                Poll::Ready(Some(ev))
            }
            Poll::Ready(None) => {
                self.finished = true;
                Poll::Ready((self.remaining > 0).then_some(Err(EngineError::Closed)))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for RequestHandle {
    fn drop(&mut self) {
        if !self.finished {
            self.cancel();
        }
    }
}

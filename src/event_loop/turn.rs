//! The turn: wait, then feed the supervisor each input of the turn in its
//! order (the signals as they are taken, so a forward goes out with the
//! least work ahead of it; the reaped children; every timer due), carrying
//! out the actions of each input, and feeding each answer (a spawned pid, a
//! retry-after value, a kill count) back before the next input.

use std::collections::VecDeque;

use super::executor::{Done, Executor};
use super::wait::{Gather, Os};
use crate::exit::Code;
use crate::supervisor::{Action, Input, Now, Supervisor};

/// Run the supervisor to its end; returns drainit's exit code.
pub fn run<O: Os>(supervisor: &mut Supervisor, exec: &mut Executor, os: &mut O) -> Code {
    let mut gather = Gather::default();
    let mut feed = Feed::default();
    supervisor.start(&mut feed.actions);
    // The start is a spawn (the worker, or the sweep's finish program).
    // Once it is carried out, what was left until then runs beside the
    // child's start: /proc's root, and the OOM-kill counter's look, before
    // the spawn's answer is fed, so that a finish program the answer
    // starts sees the count.
    if let Some(code) = feed.act(exec) {
        return code;
    }
    exec.after_first_spawn();
    if os.find_counter() {
        supervisor.oom_counter_found();
    }
    if let Some(code) = feed.carry_out(supervisor, exec, &mut Now::unread()) {
        return code;
    }
    loop {
        gather.wait(os, &mut exec.custody, std::mem::take(&mut exec.short_slice), supervisor.next_deadline());
        let mut now = Now::unread();
        let mut exit = None;
        gather.signals(os, &mut |sig| {
            if exit.is_none() {
                exit = feed.input(Input::Signal(sig), supervisor, exec, &mut now);
            }
        });
        if let Some(code) = exit {
            return code;
        }
        gather.notes(os, &exec.custody, || supervisor.next_deadline());
        gather.reaped(os, &mut exec.custody);
        for input in gather.inputs.drain(..) {
            if let Some(code) = feed.input(input, supervisor, exec, &mut now) {
                return code;
            }
        }
        // No timer armed, no clock read: the turn of a forward ends sooner.
        if supervisor.next_deadline().is_some() {
            let at = now.get();
            while let Some(due) = supervisor.take_due(at) {
                if let Some(code) = feed.input(due, supervisor, exec, &mut now) {
                    return code;
                }
            }
        }
    }
}

/// The supervisor's actions and the answers waiting to be fed.
#[derive(Default)]
struct Feed {
    actions: Vec<Action>,
    answers: VecDeque<Input>,
}

impl Feed {
    /// Feed one input, and carry out what follows. Some(code): drainit exits now.
    fn input(&mut self, input: Input, supervisor: &mut Supervisor, exec: &mut Executor, now: &mut Now) -> Option<Code> {
        supervisor.handle(input, now, &mut self.actions);
        self.carry_out(supervisor, exec, now)
    }

    /// Carry out the actions of the input just fed, and feed each answer
    /// right after it.
    fn carry_out(&mut self, supervisor: &mut Supervisor, exec: &mut Executor, now: &mut Now) -> Option<Code> {
        loop {
            if let Some(code) = self.act(exec) {
                return Some(code);
            }
            let input = self.answers.pop_front()?;
            supervisor.handle(input, now, &mut self.actions);
        }
    }

    /// Carry out the actions waiting, queueing their answers. Some(code):
    /// drainit exits now.
    fn act(&mut self, exec: &mut Executor) -> Option<Code> {
        for action in self.actions.drain(..) {
            match exec.carry_out(action) {
                Done::Nothing => {}
                Done::Answer(input) => self.answers.push_back(input),
                Done::Exit(code) => return Some(code),
            }
        }
        None
    }
}

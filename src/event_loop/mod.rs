//! The event loop, in three parts: the wait (`wait.rs`: block on the
//! sources, then gather the turn's inputs), the turn (`turn.rs`: feed each
//! input to the supervisor and carry out what it says, feeding back each
//! answer) and the executor (`executor.rs`: where actions meet the system).
//! The supervisor decides; nothing here does.
//!
//! Loop errors: setup may fail (drainit exits 2 or 125 before the worker
//! starts), but once the worker runs, an error from the wait or the take
//! (ENOMEM under memory pressure is the plausible one) is a warning, once
//! per streak, and the turn goes on as if a child might have exited: it
//! reaps and reads the clock, so reaping and the deadline still hold. Exiting
//! instead would kill the container, and with it the worker it protects.

mod executor;
mod turn;
mod wait;

pub use executor::Executor;
pub use turn::run;
pub use wait::Sources;

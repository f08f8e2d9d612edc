//! Whether the server can answer: the backend prepared and answering its readiness probe, not
//! shutting down; and the state of the rule files (a failed reload, which leaves the previous
//! rules serving and the server healthy).

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::SystemTime,
};

/// The server's health, shared by the servers, the readiness probe and the reloader.
#[derive(Clone, Debug, Default)]
pub(crate) struct Health {
    state: Arc<Mutex<State>>,
}

#[derive(Debug, Default)]
struct State {
    /// The backend has been prepared once (startup is over).
    prepared: bool,
    /// The last readiness probe's failure, if it failed.
    backend_problem: Option<String>,
    shutting_down: bool,
    /// The last reload's problems, until a reload succeeds.
    config_problem: Option<ConfigProblem>,
}

/// A reload that was refused: when, and every problem, one per line.
#[derive(Clone, Debug)]
pub(crate) struct ConfigProblem {
    pub(crate) at: SystemTime,
    pub(crate) errors: String,
}

/// What `GET /healthcheck` and the gRPC health service report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Status {
    /// Serving: `200 OK`, gRPC `SERVING`.
    Serving,
    /// Not serving, and why: `503`, gRPC `NOT_SERVING`.
    NotServing(String),
}

impl Health {
    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        // Every update is one assignment: a poisoned lock holds a consistent state.
        f(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner))
    }

    pub(crate) fn status(&self) -> Status {
        self.with(|state| {
            if state.shutting_down {
                Status::NotServing("shutting down".to_owned())
            } else if !state.prepared {
                Status::NotServing("preparing the backend".to_owned())
            } else if let Some(problem) = &state.backend_problem {
                Status::NotServing(format!("backend not ready: {problem}"))
            } else {
                Status::Serving
            }
        })
    }

    pub(crate) fn set_prepared(&self) {
        self.with(|state| state.prepared = true);
    }

    /// Records a readiness probe's result; returns whether the backend's state changed.
    pub(crate) fn set_backend(&self, problem: Option<String>) -> bool {
        self.with(|state| {
            let changed = state.backend_problem.is_some() != problem.is_some();
            state.backend_problem = problem;
            changed
        })
    }

    pub(crate) fn set_shutting_down(&self) {
        self.with(|state| state.shutting_down = true);
    }

    pub(crate) fn set_config_problem(&self, problem: Option<ConfigProblem>) {
        self.with(|state| state.config_problem = problem);
    }

    pub(crate) fn config_problem(&self) -> Option<ConfigProblem> {
        self.with(|state| state.config_problem.clone())
    }
}

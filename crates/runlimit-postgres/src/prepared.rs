//! Statements Runlimit prepares on a connection with SQL `PREPARE` and runs by name with `EXECUTE`
//! inside simple-query scripts.
//!
//! A prepared statement is parsed, analyzed and planned once per connection; PostgreSQL keeps its
//! plan in the session (`plan_cache_mode = force_generic_plan`, set transaction-locally by the
//! statements that need it, keeps that one plan instead of planning each execution for its
//! arguments). What an admission sends per execution is the statement name and its literal
//! arguments. SQL-level `EXECUTE` is used instead of the extended protocol's prepared statements
//! because SQLx sends each extended-protocol statement as a round trip of its own: `EXECUTE` keeps
//! the several statements of an admission phase in one simple query.
//!
//! Prepared statements belong to a session, and Runlimit does not own the pool's connections (it
//! cannot prepare them when they are opened), so it prepares lazily: a script is sent as if its
//! statements were prepared, and when the server answers that one is not (SQLSTATE 26000,
//! `invalid_sql_statement_name`: a new connection, or one whose session ran `DEALLOCATE` or
//! `DISCARD`), the failed transaction, which has done nothing, is rolled back and the script sent
//! again in the same round trip with a `PREPARE` right before the `EXECUTE` of each statement from
//! the failing one on, and the `PREPARE` statements of the statements a later round trip of the
//! same operation executes at its end. They run inside the transaction, after `BEGIN` (which must
//! be a transaction's first statement to set its isolation level whatever the session's defaults)
//! and after the statements before them, so a `PREPARE` that has to lock a table to analyze it
//! waits under the timeouts those set; a prepared statement outlives the transaction it was
//! prepared in, even one rolled back. The first admission on each connection therefore costs one
//! more round trip. (A later round trip that finds its statement missing, because the session
//! deallocated that one statement alone, fails its operation without consuming anything and closes
//! the connection, so the next operation prepares everything on a new one.) A `PREPARE` the server
//! refuses because the name is taken (SQLSTATE 42P05, `duplicate_prepared_statement`) means that
//! statement exists, and it is not prepared again. Anything else fails the operation, classified as
//! every other failure of its phase.
//!
//! The statement texts name every table, function and operator schema-qualified
//! (`OPERATOR(pg_catalog.=)`), so the `search_path` in force when they are prepared or run changes
//! nothing; names end in a version (`_v1`), and a text never changes under a name.

use std::time::Duration;

use sqlx::PgConnection;
use tokio::time::Instant as Deadline;

use crate::{
    error::{CheckError, CheckPhase, sqlstate},
    script::{self, ScriptOutput},
    transaction::check_failure,
};

/// A statement Runlimit prepares on each connection that uses it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Prepared {
    /// The statement's name.
    pub(crate) name: &'static str,
    /// `PREPARE <name> (..) AS ..;`
    pub(crate) prepare: &'static str,
}

/// One statement of an admission's first round trip.
#[derive(Debug)]
pub(crate) struct Statement {
    /// Its SQL, terminated by `;`.
    pub(crate) sql: String,
    /// The phase a failure of it is reported in.
    pub(crate) phase: CheckPhase,
    /// The prepared statement it executes, if it is an `EXECUTE`.
    pub(crate) executes: Option<&'static Prepared>,
}

/// How many times [`run_phases`] sends a script: once, plus twice per statement it may have to
/// prepare (each retry prepares at least one more, or learns that one exists), plus one.
fn attempts(statements: usize) -> usize {
    2 * statements + 2
}

/// What a script sent: per statement of the script, the index of the caller's statement it is
/// (`None` for the `ROLLBACK` and the `PREPARE` statements around them), the statement it
/// prepares, and its phase.
struct Sent {
    sql: String,
    origin: Vec<Option<usize>>,
    prepares: Vec<Option<&'static Prepared>>,
    phases: Vec<CheckPhase>,
}

impl Sent {
    fn push(
        &mut self,
        sql: &str,
        origin: Option<usize>,
        prepares: Option<&'static Prepared>,
        phase: CheckPhase,
    ) {
        self.sql.push_str(sql);
        self.sql.push('\n');
        self.origin.push(origin);
        self.prepares.push(prepares);
        self.phases.push(phase);
    }
}

/// The script of one attempt: `ROLLBACK` first when the previous attempt left its transaction
/// aborted, then `statements` with a `PREPARE` right before each `EXECUTE` of a statement in
/// `to_prepare`, then the `PREPARE` statements of `to_prepare` that no statement of this round
/// trip executes. Every `PREPARE` runs inside the transaction `statements` begin (so the
/// session's default isolation level and read-only mode cannot refuse the `BEGIN`) and after
/// the statements before it (so a `PREPARE` that must lock a table waits under the timeouts
/// those statements set).
fn script(rollback_first: bool, statements: &[Statement], to_prepare: &[&'static Prepared]) -> Sent {
    let last_phase = statements.last().map_or(CheckPhase::Begin, |statement| statement.phase);
    let first_phase = statements.first().map_or(CheckPhase::Begin, |statement| statement.phase);
    let mut sent = Sent { sql: String::new(), origin: Vec::new(), prepares: Vec::new(), phases: Vec::new() };
    if rollback_first {
        sent.push(script::ROLLBACK, None, None, first_phase);
    }
    let mut placed = Vec::new();
    for (index, statement) in statements.iter().enumerate() {
        if let Some(prepared) = statement.executes
            && to_prepare.iter().any(|wanted| wanted.name == prepared.name)
            && !placed.contains(&prepared.name)
        {
            sent.push(prepared.prepare, None, Some(prepared), statement.phase);
            placed.push(prepared.name);
        }
        sent.push(&statement.sql, Some(index), None, statement.phase);
    }
    for prepared in to_prepare {
        if !placed.contains(&prepared.name) {
            sent.push(prepared.prepare, None, Some(prepared), last_phase);
            placed.push(prepared.name);
        }
    }
    sent
}

/// Runs the first round trip of an admission, `statements` (the first of them `BEGIN`; for the
/// statement protocol of earlier releases none executes a prepared statement, and this is one
/// plain script), preparing the statements they execute where the connection lacks them, together with
/// `later`, the statements later round trips of the operation execute (see the [module
/// docs](self)). The output is that of `statements` alone, statement indices as in
/// `statements`.
///
/// # Errors
///
/// A failure is classified by [`check_failure`] at its statement's phase (a `PREPARE` takes
/// the phase of the statement after it, a `ROLLBACK` the first phase). An answer with another
/// number of statements is a malformed response of the last phase.
pub(crate) async fn run_phases(
    connection: &mut PgConnection,
    statements: &[Statement],
    deadline: Deadline,
    later: &[&'static Prepared],
    timeout: Duration,
) -> Result<ScriptOutput, CheckError> {
    let mut to_prepare: Vec<&'static Prepared> = Vec::new();
    let mut rollback_first = false;
    let executed = statements.iter().filter(|statement| statement.executes.is_some()).count();
    let mut remaining = attempts(executed + later.len());
    loop {
        remaining -= 1;
        let sent = script(rollback_first, statements, &to_prepare);
        let error = match script::run(connection, sent.sql, deadline).await {
            Ok(output) => return keep_own(output, &sent.origin, statements),
            Err(error) => error,
        };
        let code = match &error.failure {
            script::Failure::Sqlx(source) if remaining > 0 => sqlstate(source),
            _ => None,
        };
        let failed = error.completed;
        // `BEGIN` is the first statement after the optional `ROLLBACK`: a failure after it
        // leaves the transaction open and aborted.
        let begin_at = usize::from(rollback_first);
        match (code.as_deref(), sent.origin.get(failed).copied().flatten()) {
            // A statement names a statement this session does not have: prepare it, every one
            // executed after it and those of the later round trips.
            (Some("26000"), Some(index)) if statements[index].executes.is_some() => {
                to_prepare = statements[index..]
                    .iter()
                    .filter_map(|statement| statement.executes)
                    .chain(later.iter().copied())
                    .collect();
                rollback_first = failed > begin_at;
            }
            // This session already has that statement, and the ones prepared before it in this
            // script are prepared now (`PREPARE` is not undone by the failure).
            (Some("42P05"), None) if sent.prepares.get(failed).copied().flatten().is_some() => {
                let done: Vec<&str> =
                    sent.prepares[..=failed].iter().flatten().map(|prepared| prepared.name).collect();
                to_prepare.retain(|prepared| !done.contains(&prepared.name));
                rollback_first = failed > begin_at;
            }
            _ => return Err(check_failure(error, &sent.phases, timeout)),
        }
    }
}

/// The output of a script without the statements `run_phases` added (`ROLLBACK` and `PREPARE`
/// statements, which return no rows), checked to hold one entry per statement of the caller.
fn keep_own(
    output: ScriptOutput,
    origin: &[Option<usize>],
    statements: &[Statement],
) -> Result<ScriptOutput, CheckError> {
    let last = statements.last().map_or(CheckPhase::Begin, |statement| statement.phase);
    let malformed = CheckError::MalformedResponse { phase: last, reason: "statement count differs" };
    if output.affected.len() != origin.len() {
        return Err(malformed);
    }
    let mut own = ScriptOutput::default();
    for (affected, from) in output.affected.iter().zip(origin) {
        if from.is_some() {
            own.affected.push(*affected);
        }
    }
    for (index, row) in output.rows {
        match origin.get(index).copied().flatten() {
            Some(own_index) => own.rows.push((own_index, row)),
            None => return Err(malformed),
        }
    }
    if own.affected.len() == statements.len() { Ok(own) } else { Err(malformed) }
}

//! Statements Runlimit prepares on a connection with SQL `PREPARE` and runs by name with
//! `EXECUTE` inside simple-query scripts.
//!
//! A prepared statement is parsed, analyzed and planned once per connection; PostgreSQL keeps
//! its plan in the session (`plan_cache_mode = force_generic_plan`, set transaction-locally
//! by the statements that need it, keeps that one plan instead of planning each execution
//! for its arguments). What an admission sends per execution is the statement name and its
//! literal arguments. SQL-level `EXECUTE` is used instead of the extended protocol's prepared
//! statements because SQLx sends each extended-protocol statement as a round trip of its own:
//! `EXECUTE` keeps the several statements of an admission phase in one simple query.
//!
//! Prepared statements belong to a session, and Runlimit does not own the pool's
//! connections (it cannot prepare them when they are opened), so it prepares lazily: a script
//! is sent as if its statements were prepared, and when the server answers that one is not
//! (SQLSTATE 26000, `invalid_sql_statement_name`: a new connection, or one whose session ran
//! `DEALLOCATE` or `DISCARD`), the failed transaction, which has done nothing, is rolled back
//! and the script sent again in the same round trip after `PREPARE` statements for the
//! statements from the failing one on. The first admission on each connection therefore costs
//! one more round trip. A `PREPARE` the server refuses because the name is taken (SQLSTATE
//! 42P05, `duplicate_prepared_statement`) means that statement exists, and it is not prepared
//! again. Anything else fails the operation, classified as every other failure of its phase.
//!
//! The statement texts name every table, function and operator schema-qualified
//! (`OPERATOR(pg_catalog.=)`), so the `search_path` in force when they are prepared or run
//! changes nothing; names end in a version (`_v1`), and a text never changes under a name.

use std::time::Duration;

use sqlx::PgConnection;
use tokio::time::Instant as Deadline;

use crate::{
    error::{CheckError, CheckPhase, sqlstate},
    script::{self, ScriptOutput},
    transaction::check_failure,
};

/// A statement Runlimit prepares on each connection that uses it.
#[derive(Debug)]
pub(crate) struct Prepared {
    /// The statement's name.
    pub(crate) name: &'static str,
    /// `PREPARE <name> (..) AS ..;`
    pub(crate) prepare: &'static str,
}

/// How many times [`run_phases`] sends a script: once, plus once per statement it may have to
/// prepare (each retry prepares at least one more, or learns that one exists), plus one.
fn attempts(executes: usize) -> usize {
    2 * executes + 2
}

/// Runs the first round trip of an admission, `sql`, whose statement `i` belongs to
/// `phases[i]` and which executes the prepared statements `executes` (`(statement index,
/// statement)`, ascending), preparing them first where the connection lacks them (see the
/// [module docs](self)). The output is that of `sql` alone, statement indices as in `sql`.
///
/// # Errors
///
/// A failure of `sql` is classified by [`check_failure`] at its statement's phase; a failure
/// of the `ROLLBACK` or a `PREPARE` sent before it is a failure of the first phase. An answer
/// with another number of statements is a malformed response of the last phase.
pub(crate) async fn run_phases(
    connection: &mut PgConnection,
    sql: &str,
    deadline: Deadline,
    phases: &[CheckPhase],
    executes: &[(usize, &'static Prepared)],
    timeout: Duration,
) -> Result<ScriptOutput, CheckError> {
    let mut to_prepare: Vec<&'static Prepared> = Vec::new();
    let mut rollback_first = false;
    let mut remaining = attempts(executes.len());
    loop {
        remaining -= 1;
        let mut script = String::new();
        if rollback_first {
            script.push_str(script::ROLLBACK);
            script.push('\n');
        }
        for statement in &to_prepare {
            script.push_str(statement.prepare);
            script.push('\n');
        }
        let prepare_from = usize::from(rollback_first);
        let prefix = prepare_from + to_prepare.len();
        script.push_str(sql);
        let mut all_phases = vec![phases.first().copied().unwrap_or(CheckPhase::Begin); prefix];
        all_phases.extend_from_slice(phases);
        let error = match script::run(connection, script, deadline).await {
            Ok(output) => return strip_prefix(output, prefix, phases),
            Err(error) => error,
        };
        let code = match &error.failure {
            script::Failure::Sqlx(source) if remaining > 0 => sqlstate(source),
            _ => None,
        };
        match code.as_deref() {
            // A statement of `sql` names a statement this session does not have: prepare it and
            // every one after it.
            Some("26000") if error.completed >= prefix => {
                let failed = error.completed - prefix;
                to_prepare = executes
                    .iter()
                    .filter(|(index, _)| *index >= failed)
                    .map(|(_, statement)| *statement)
                    .collect();
                if to_prepare.is_empty() {
                    return Err(check_failure(error, &all_phases, timeout));
                }
                // The failure came after `BEGIN`: the transaction is open and aborted.
                rollback_first = failed > 0;
            }
            // This session already has that statement, and the ones prepared before it in this
            // script are prepared now (`PREPARE` is not undone by the failure).
            Some("42P05") if (prepare_from..prefix).contains(&error.completed) => {
                to_prepare.drain(..=error.completed - prepare_from);
                // The failed `PREPARE` ended the implicit transaction it ran in.
                rollback_first = false;
            }
            _ => return Err(check_failure(error, &all_phases, timeout)),
        }
    }
}

/// The output of a script without its first `prefix` statements (`ROLLBACK` and `PREPARE`
/// statements, which return no rows), checked to hold one entry per phase.
fn strip_prefix(
    mut output: ScriptOutput,
    prefix: usize,
    phases: &[CheckPhase],
) -> Result<ScriptOutput, CheckError> {
    let last = phases.last().copied().unwrap_or(CheckPhase::Begin);
    let malformed = CheckError::MalformedResponse { phase: last, reason: "statement count differs" };
    if output.affected.len() != prefix + phases.len() || output.rows.iter().any(|(index, _)| *index < prefix)
    {
        return Err(malformed);
    }
    output.affected.drain(..prefix);
    for (index, _) in &mut output.rows {
        *index -= prefix;
    }
    Ok(output)
}

//! Startup errors name the flag or address, the cause and the fix, once each: the built
//! binary run with bad options, its exit status and its last stderr line.

use std::process::Command;

/// Runs the demo with `args` and returns its exit success and its last stderr line.
fn run(args: &[&str]) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_runlimit-demo"))
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .env("RUNLIMIT_KEY_SECRET", "startup-error-test-secret-0123456789")
        .env_remove("DATABASE_URL")
        .env_remove("REDIS_URL")
        .output()
        .expect("the demo binary runs");
    let stderr = String::from_utf8(output.stderr).expect("utf-8 stderr");
    let last = stderr.lines().rfind(|line| !line.trim().is_empty()).unwrap_or_default().to_owned();
    (output.status.success(), last)
}

#[test]
fn a_malformed_database_url_names_the_flag_and_the_expected_form() {
    let (ok, message) = run(&["--database-url", "notaurl"]);
    assert!(!ok);
    assert_eq!(
        message,
        "runlimit-demo: --database-url is not a PostgreSQL URL; expected postgres://USER@HOST:PORT/DATABASE: \
         error with configuration: no postgres:// or postgresql:// scheme"
    );
}

#[test]
fn without_a_key_secret_a_startup_error_is_all_that_is_printed() {
    // No RUNLIMIT_KEY_SECRET: the demo would warn about its ephemeral secret, but only once it
    // is going to serve; a fatal error comes alone.
    let output = Command::new(env!("CARGO_BIN_EXE_runlimit-demo"))
        .args(["--listen", "127.0.0.1:0", "--database-url", "mysql://demo@127.0.0.1/app"])
        .env_remove("RUNLIMIT_KEY_SECRET")
        .env_remove("DATABASE_URL")
        .env_remove("REDIS_URL")
        .output()
        .expect("the demo binary runs");
    assert!(!output.status.success());
    assert_eq!(
        String::from_utf8(output.stderr).expect("utf-8 stderr").trim_end(),
        "runlimit-demo: --database-url is not a PostgreSQL URL; expected postgres://USER@HOST:PORT/DATABASE: \
         error with configuration: the scheme is `mysql`, not postgres or postgresql"
    );
}

#[test]
fn an_unreachable_server_names_its_address_and_the_cause_at_once() {
    // A loopback port nothing listens on: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let started = std::time::Instant::now();
    let (ok, message) = run(&["--database-url", &format!("postgres://demo:secret@127.0.0.1:{port}/app")]);
    assert!(!ok);
    assert_eq!(
        message,
        format!(
            "runlimit-demo: cannot connect to PostgreSQL at 127.0.0.1:{port}/app (--database-url); check that the \
             server runs there, accepts TCP connections and has the database: error communicating with database: \
             Connection refused (os error 111)"
        )
    );
    assert!(!message.contains("secret"), "the password is never printed");
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "a refused connection fails at once");
}

#[test]
fn an_unreachable_redis_server_names_its_address_the_cause_and_the_fix_at_once() {
    // A loopback port nothing listens on: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let started = std::time::Instant::now();
    let (ok, message) = run(&["--redis-url", &format!("redis://demo:secret@127.0.0.1:{port}/0")]);
    assert!(!ok);
    assert_eq!(
        message,
        format!(
            "runlimit-demo: cannot use Redis at 127.0.0.1:{port} (--redis-url); check that the server runs there, \
             accepts TCP connections, and that the URL's credentials and database are right: could not prepare \
             the Redis server: could not connect to Redis at 127.0.0.1:{port}: Connection refused (os error 111)"
        )
    );
    assert!(!message.contains("secret"), "the password is never printed");
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "a refused connection fails at once");
}

#[test]
fn a_silent_redis_server_is_named_with_the_timeout_within_seconds() {
    // A loopback listener that never answers: the kernel completes the TCP handshake, nobody
    // speaks Redis.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let started = std::time::Instant::now();
    let (ok, message) = run(&["--redis-url", &format!("redis://127.0.0.1:{port}")]);
    assert!(!ok);
    assert_eq!(
        message,
        format!(
            "runlimit-demo: cannot use Redis at 127.0.0.1:{port} (--redis-url); check that the server runs there, \
             accepts TCP connections, and that the URL's credentials and database are right: could not prepare \
             the Redis server: timed out after 1s connecting to Redis at 127.0.0.1:{port}"
        )
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "bounded by the 1 s connect timeout");
    drop(silent);
}

#[test]
fn a_redis_url_the_demo_cannot_use_names_the_flag_and_the_expected_form() {
    let expected = "runlimit-demo: --redis-url is not a usable Redis URL; expected \
                    redis://[USER:PASSWORD@]HOST[:PORT][/DB], rediss://[USER:PASSWORD@]HOST[:PORT][/DB] (TLS) or \
                    redis+unix:///PATH: ";
    let (ok, message) = run(&["--redis-url", "notaurl"]);
    assert!(!ok);
    assert_eq!(
        message,
        format!("{expected}invalid Redis URL: Redis URL did not parse - InvalidClientConfig")
    );
}

#[test]
fn the_redis_url_from_the_environment_is_never_shown_by_help() {
    let output = Command::new(env!("CARGO_BIN_EXE_runlimit-demo"))
        .arg("--help")
        .env("REDIS_URL", "redis://demo:hunter2@127.0.0.1:6379")
        .env("DATABASE_URL", "postgres://demo:hunter2@127.0.0.1/app")
        .output()
        .expect("the demo binary runs");
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).unwrap();
    assert!(!help.contains("hunter2"), "{help}");
    assert!(help.contains("[env: REDIS_URL]"), "{help}");
    assert!(help.contains("--redis-key-prefix <PREFIX>"), "{help}");
    assert!(
        help.contains(
            "With --redis-url (or REDIS_URL) the identity gate and the GCRA gate of /items move to"
        ),
        "{help}"
    );
}

#[test]
fn a_zero_second_flag_is_refused_by_name_in_seconds() {
    let (ok, message) = run(&["--attempt-delay-cap-secs", "0"]);
    assert!(!ok);
    assert_eq!(message, "For more information, try '--help'.");
    let output = Command::new(env!("CARGO_BIN_EXE_runlimit-demo"))
        .args(["--attempt-delay-cap-secs", "0"])
        .output()
        .expect("the demo binary runs");
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.starts_with(
            "error: invalid value '0' for '--attempt-delay-cap-secs <SECONDS>': 0 is not in 1.."
        ),
        "{stderr}"
    );
}

#[test]
fn a_database_url_of_another_scheme_names_the_flag_and_the_scheme() {
    let (ok, message) = run(&["--database-url", "mysql://demo@127.0.0.1/app"]);
    assert!(!ok);
    assert_eq!(
        message,
        "runlimit-demo: --database-url is not a PostgreSQL URL; expected postgres://USER@HOST:PORT/DATABASE: \
         error with configuration: the scheme is `mysql`, not postgres or postgresql"
    );
}

#[test]
fn a_zero_items_burst_or_quota_names_the_flag() {
    for flag in ["--items-burst", "--items-quota"] {
        let output = Command::new(env!("CARGO_BIN_EXE_runlimit-demo"))
            .args(["--listen", "127.0.0.1:0", flag, "0"])
            .env("RUNLIMIT_KEY_SECRET", "startup-error-test-secret-0123456789")
            .output()
            .expect("the demo binary runs");
        assert!(!output.status.success());
        let stderr = String::from_utf8(output.stderr).expect("utf-8 stderr");
        assert_eq!(
            stderr.lines().next(),
            Some(
                format!("error: invalid value '0' for '{flag} <N>': 0 is not in 1..18446744073709551615")
                    .as_str()
            )
        );
    }
}

/// The test server's `host:port`, from `RUNLIMIT_POSTGRES_TEST_DATABASE_URL`.
fn postgres_server() -> String {
    let url = std::env::var("RUNLIMIT_POSTGRES_TEST_DATABASE_URL")
        .expect("RUNLIMIT_POSTGRES_TEST_DATABASE_URL names a PostgreSQL server (scripts/test sets it)");
    let authority = url.split_once("://").map_or(url.as_str(), |(_, rest)| rest);
    let authority = authority.split('/').next().unwrap_or_default();
    authority.rsplit_once('@').map_or(authority, |(_, host)| host).to_owned()
}

#[test]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
fn a_missing_database_or_role_is_named_with_the_fix() {
    let server = postgres_server();
    let (host, port) = server.rsplit_once(':').unwrap_or((server.as_str(), "5432"));
    let (ok, message) =
        run(&["--database-url", &format!("postgres://postgres@{server}/runlimit_no_such_database")]);
    assert!(!ok);
    assert_eq!(
        message,
        format!(
            "runlimit-demo: PostgreSQL at {host}:{port}/runlimit_no_such_database (--database-url) refused the \
             connection: database \"runlimit_no_such_database\" does not exist; create it (createdb -h {host} -p \
             {port} -U postgres runlimit_no_such_database) or name one that exists"
        )
    );
    let (ok, message) =
        run(&["--database-url", &format!("postgres://runlimit_no_such_role@{server}/postgres")]);
    assert!(!ok);
    assert_eq!(
        message,
        format!(
            "runlimit-demo: PostgreSQL at {host}:{port}/postgres (--database-url) refused the connection: role \
             \"runlimit_no_such_role\" does not exist; check the user and password in the URL, and the server's \
             pg_hba.conf"
        )
    );
}

#[test]
fn a_rediss_url_to_a_server_without_tls_says_so() {
    // A loopback listener that never answers: the TLS handshake never completes, as with a
    // Redis server that speaks no TLS on that port.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let (ok, message) = run(&["--redis-url", &format!("rediss://127.0.0.1:{port}")]);
    assert!(!ok);
    assert_eq!(
        message,
        format!(
            "runlimit-demo: cannot use Redis at 127.0.0.1:{port} over TLS (--redis-url rediss://...); check that the \
             server listens for TLS on that port (a server without TLS needs redis://), that a CA this system \
             trusts issued its certificate for that host, and that the URL's credentials and database are right: \
             could not prepare the Redis server: timed out after 1s connecting to Redis at 127.0.0.1:{port}"
        )
    );
    drop(silent);
}

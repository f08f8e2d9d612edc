//! Connection URLs.

use sqlx::postgres::PgConnectOptions;

/// Parses a PostgreSQL connection URL (`postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE`, or
/// the `postgresql://` spelling; the scheme is matched ignoring ASCII case) into SQLx's
/// connect options, for an application that takes the URL from its user.
///
/// SQLx's own `str::parse` reads the host, port, user and database of a URL whatever its
/// scheme, so `mysql://USER@HOST/DB` would connect to a PostgreSQL server on HOST's port 5432
/// and fail there with an unrelated error (`role "USER" does not exist`); this refuses it
/// before any connection.
///
/// # Errors
///
/// [`sqlx::Error::Configuration`](https://docs.rs/sqlx/0.9/sqlx/enum.Error.html#variant.Configuration)
/// when the URL has another scheme (its message then reads ``the scheme is `mysql`, not postgres
/// or postgresql``) or none (`no postgres:// or postgresql:// scheme`); SQLx's parse error when
/// the rest of the URL is malformed.
///
/// # Examples
///
/// ```
/// let options = runlimit_postgres::connect_options_from_url("postgres://app@db.internal:5433/limits")?;
/// assert_eq!((options.get_host(), options.get_port()), ("db.internal", 5433));
///
/// let refused = runlimit_postgres::connect_options_from_url("mysql://app@db.internal/limits").unwrap_err();
/// assert_eq!(
///     refused.to_string(),
///     "error with configuration: the scheme is `mysql`, not postgres or postgresql"
/// );
/// # Ok::<(), sqlx::Error>(())
/// ```
pub fn connect_options_from_url(url: &str) -> Result<PgConnectOptions, sqlx::Error> {
    let scheme = url.split_once("://").map(|(scheme, _)| scheme);
    if !scheme.is_some_and(|scheme| {
        scheme.eq_ignore_ascii_case("postgres") || scheme.eq_ignore_ascii_case("postgresql")
    }) {
        let reason = match scheme {
            Some(scheme) => format!("the scheme is `{scheme}`, not postgres or postgresql"),
            None => "no postgres:// or postgresql:// scheme".to_owned(),
        };
        return Err(sqlx::Error::Configuration(reason.into()));
    }
    url.parse()
}

#[cfg(test)]
mod tests {
    use super::connect_options_from_url;

    #[test]
    fn only_postgres_schemes_are_accepted() {
        for url in ["postgres://u@h/db", "postgresql://u@h/db", "POSTGRES://u@h/db"] {
            let options = connect_options_from_url(url).unwrap();
            assert_eq!((options.get_host(), options.get_database()), ("h", Some("db")), "{url}");
        }
        assert_eq!(
            connect_options_from_url("redis://u@h/db").unwrap_err().to_string(),
            "error with configuration: the scheme is `redis`, not postgres or postgresql"
        );
        assert_eq!(
            connect_options_from_url("u@h/db").unwrap_err().to_string(),
            "error with configuration: no postgres:// or postgresql:// scheme"
        );
    }
}

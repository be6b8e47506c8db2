//! Dashboard users from the command line (`holdfast user …`), and the sign-in
//! help printed at start-up: the demo's users, or on a first start the `admin`
//! user's one-time password.

use std::io::BufRead;

use anyhow::Context;
use holdfast_engine::users::{self, Role};
use sqlx::PgPool;

use crate::config::{GlobalArgs, UserCommand};

fn role(name: &str) -> anyhow::Result<Role> {
    Role::parse(name)
        .with_context(|| format!("unknown role '{name}': use viewer, support or admin"))
}

/// Runs `holdfast user …`.
pub async fn command(global: &GlobalArgs, cmd: UserCommand) -> anyhow::Result<()> {
    let pg = holdfast_engine::store::connect_and_migrate(&global.database_url, 2).await?;
    match cmd {
        UserCommand::Add {
            username,
            role: r,
            password_stdin,
        } => {
            let r = role(&r)?;
            let (password, one_time) = if password_stdin {
                let mut line = String::new();
                std::io::stdin().lock().read_line(&mut line)?;
                (line.trim_end_matches(['\r', '\n']).to_owned(), false)
            } else {
                (users::generate_password(), true)
            };
            users::create(&pg, &username, r, &password, one_time).await??;
            println!("user {username} added as {}", r.as_str());
            if one_time {
                println!("{password}");
                eprintln!(
                    "one-time password, shown once: {username} chooses their own at first sign-in"
                );
            }
        }
        UserCommand::List => {
            for u in users::list(&pg).await? {
                println!(
                    "{:<24} {:<8} {}{}",
                    u.username,
                    u.role.as_str(),
                    u.created_at.format("%Y-%m-%d %H:%M"),
                    if u.must_change_password {
                        "  (one-time password)"
                    } else {
                        ""
                    }
                );
            }
        }
        UserCommand::Role { username, role: r } => {
            users::set_role(&pg, &username, role(&r)?).await??;
            println!("{username} is now {r}");
        }
        UserCommand::ResetPassword { username } => {
            let password = users::generate_password();
            users::set_password(&pg, &username, &password, true, None).await??;
            println!("{password}");
            eprintln!("one-time password for {username}, shown once; their sessions were ended");
        }
        UserCommand::Delete { username } => {
            users::delete(&pg, &username).await??;
            println!("user {username} deleted");
        }
    }
    Ok(())
}

/// At start-up: with `demo_password`, makes sure the demo users exist and says
/// how to sign in; otherwise, on a database without users, creates `admin` with
/// a one-time password and prints it (once: the next start finds the user).
pub async fn sign_in_help(pg: &PgPool, demo_password: Option<&str>) -> anyhow::Result<()> {
    if let Some(password) = demo_password {
        for (name, r) in [
            ("admin", Role::Admin),
            ("support", Role::Support),
            ("viewer", Role::Viewer),
        ] {
            // An existing user (a taken name) is left as it is.
            let _ = users::create(pg, name, r, password, false).await?;
        }
        println!(
            "Demo sign-in: users admin, support and viewer, password '{password}' \
             (unless they existed before with other passwords)"
        );
    } else if let Some(password) = users::ensure_first_admin(pg).await? {
        println!("First start: created the user 'admin' with the one-time password {password}");
        println!("Sign in at /login and choose your own password; it is not shown again.");
    }
    Ok(())
}

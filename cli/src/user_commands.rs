//! Dashboard users from the command line (`holdfast user …`), each change
//! written to the audit log.

use std::io::BufRead;

use anyhow::Context;
use holdfast_engine::audit::{cli_actor, note};
use holdfast_engine::users::{self, Role};

use crate::config::{GlobalArgs, UserCommand};

fn role(name: &str) -> anyhow::Result<Role> {
    Role::parse(name).with_context(|| {
        format!("unknown role '{name}': use viewer, support, merchandiser or admin")
    })
}

/// Runs `holdfast user …`.
pub async fn command(global: &GlobalArgs, cmd: UserCommand) -> anyhow::Result<()> {
    let pg = holdfast_engine::postgres::connect_and_migrate(&global.database_url, 2).await?;
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
            users::create(&pg, &username, r, &password, one_time).await?;
            note(
                &pg,
                &cli_actor(),
                "create_user",
                &username,
                serde_json::json!({ "role": r.as_str() }),
            )
            .await;
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
            users::set_role(&pg, &username, role(&r)?).await?;
            note(
                &pg,
                &cli_actor(),
                "set_user_role",
                &username,
                serde_json::json!({ "role": r }),
            )
            .await;
            println!("{username} is now {r}");
        }
        UserCommand::ResetPassword { username } => {
            let password = users::generate_password();
            users::set_password(&pg, &username, &password, true, None).await?;
            note(
                &pg,
                &cli_actor(),
                "reset_password",
                &username,
                serde_json::json!({}),
            )
            .await;
            println!("{password}");
            eprintln!("one-time password for {username}, shown once; their sessions were ended");
        }
        UserCommand::Delete { username } => {
            users::delete(&pg, &username).await?;
            note(
                &pg,
                &cli_actor(),
                "delete_user",
                &username,
                serde_json::json!({}),
            )
            .await;
            println!("user {username} deleted");
        }
    }
    Ok(())
}

//! Users and API tokens (admin only).

use leptos::prelude::*;

use crate::dto::people::{NewTokenView, TokenView, UserView};
use holdfast_domain::Role;

/// Every user.
#[server(endpoint = "list_users")]
pub async fn list_users() -> Result<Vec<UserView>, ServerFnError> {
    use holdfast_domain::Permission;
    use holdfast_engine::users;

    use crate::server::{convert, guard};

    let caller = guard::authorize(Permission::ManageAccess).await?;
    Ok(users::list(&caller.backends.pg)
        .await
        .map_err(guard::internal("Listing users"))?
        .into_iter()
        .map(convert::user_view)
        .collect())
}

/// Creates a user with a generated one-time password, returned once; they must
/// choose their own at first sign-in.
#[server(endpoint = "create_user")]
pub async fn create_user(username: String, role: Role) -> Result<String, ServerFnError> {
    use holdfast_domain::Permission;
    use holdfast_engine::users;

    use crate::server::guard;

    let caller = guard::authorize(Permission::ManageAccess).await?;
    let username = username.trim().to_lowercase();
    let password = users::generate_password();
    users::create(&caller.backends.pg, &username, role, &password, true)
        .await
        .map_err(guard::user_error("Creating the user"))?;
    guard::audit(
        &caller,
        "create_user",
        &username,
        serde_json::json!({ "role": role.as_str() }),
    )
    .await;
    Ok(password)
}

/// Changes a user's role; the last admin cannot be demoted.
#[server(endpoint = "set_user_role")]
pub async fn set_user_role(username: String, role: Role) -> Result<(), ServerFnError> {
    use holdfast_domain::Permission;
    use holdfast_engine::users;

    use crate::server::guard;

    let caller = guard::authorize(Permission::ManageAccess).await?;
    users::set_role(&caller.backends.pg, &username, role)
        .await
        .map_err(guard::user_error("Changing the role"))?;
    guard::audit(
        &caller,
        "set_user_role",
        &username,
        serde_json::json!({ "role": role.as_str() }),
    )
    .await;
    Ok(())
}

/// Deletes a user and ends their sessions; the last admin cannot be deleted.
#[server(endpoint = "delete_user")]
pub async fn delete_user(username: String) -> Result<(), ServerFnError> {
    use holdfast_domain::Permission;
    use holdfast_engine::users;

    use crate::server::guard;

    let caller = guard::authorize(Permission::ManageAccess).await?;
    users::delete(&caller.backends.pg, &username)
        .await
        .map_err(guard::user_error("Deleting the user"))?;
    guard::audit(&caller, "delete_user", &username, serde_json::json!({})).await;
    Ok(())
}

/// Every API token (secrets are never shown again).
#[server(endpoint = "list_tokens")]
pub async fn list_tokens() -> Result<Vec<TokenView>, ServerFnError> {
    use holdfast_domain::Permission;
    use holdfast_engine::tokens;

    use crate::server::{convert, guard};

    let caller = guard::authorize(Permission::ManageAccess).await?;
    Ok(tokens::list(&caller.backends.pg)
        .await
        .map_err(guard::internal("Listing tokens"))?
        .into_iter()
        .map(convert::token_view)
        .collect())
}

/// Creates an API token with `scopes` (comma-separated: checkout, ingest, read, catalog);
/// its secret is returned this once.
#[server(endpoint = "create_token")]
pub async fn create_token(name: String, scopes: String) -> Result<NewTokenView, ServerFnError> {
    use holdfast_domain::Permission;
    use holdfast_engine::tokens::{self, Scope};

    use crate::server::{convert, guard};

    let caller = guard::authorize(Permission::ManageAccess).await?;
    let name = name.trim().to_owned();
    let bad = |m: &str| guard::refuse(http::StatusCode::BAD_REQUEST, m.to_owned());
    let scopes = Scope::parse_list([scopes.as_str()]).map_err(|e| bad(&format!("{e}.")))?;
    if scopes.is_empty() || name.is_empty() {
        return Err(bad("Give the token a name and at least one scope."));
    }
    let created = tokens::create(&caller.backends.pg, &name, &scopes)
        .await
        .map_err(guard::internal("Creating the token"))?;
    guard::audit(
        &caller,
        "create_token",
        &name,
        serde_json::json!({ "id": created.info.id, "scopes": Scope::join(&scopes) }),
    )
    .await;
    Ok(NewTokenView {
        token: convert::token_view(created.info),
        secret: created.secret,
    })
}

/// Revokes an API token; the API refuses it within five seconds (its cache).
#[server(endpoint = "revoke_token")]
pub async fn revoke_token(id: i64) -> Result<(), ServerFnError> {
    use holdfast_domain::Permission;
    use holdfast_engine::tokens;

    use crate::server::guard;

    let caller = guard::authorize(Permission::ManageAccess).await?;
    let revoked = tokens::revoke(&caller.backends.pg, id)
        .await
        .map_err(guard::internal("Revoking the token"))?;
    if !revoked {
        return Err(guard::refuse(
            http::StatusCode::NOT_FOUND,
            format!("There is no live token {id}."),
        ));
    }
    guard::audit(
        &caller,
        "revoke_token",
        &id.to_string(),
        serde_json::json!({}),
    )
    .await;
    Ok(())
}

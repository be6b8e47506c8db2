//! Signing in and out, the signed-in user, and replacing a one-time password.

use leptos::prelude::*;

use crate::dto::people::Me;

/// Checks a username and password; on success sets the HttpOnly session cookie.
#[server(endpoint = "login")]
pub async fn login(username: String, password: String) -> Result<Me, ServerFnError> {
    use crate::server::{convert, guard};
    guard::check_origin()?;
    let backends = guard::backends()?;
    let replaces = guard::incoming_session();
    let device = guard::incoming_device();
    let attempt = holdfast_engine::users::Attempt {
        username: &username,
        password: &password,
        from: guard::client_ip(),
        replaces: replaces.as_deref(),
        device: device.as_deref(),
    };
    match holdfast_engine::users::login(&backends, attempt)
        .await
        .map_err(guard::internal("Signing in"))?
    {
        Some(signed_in) => {
            guard::set_cookie(guard::session_cookie(Some(&signed_in.session)));
            guard::set_device_cookie(&signed_in.device);
            Ok(convert::me(&signed_in.user))
        }
        None => Err(guard::refuse(
            http::StatusCode::UNAUTHORIZED,
            "That username and password do not match.",
        )),
    }
}

/// Ends the session and clears the cookie.
#[server(endpoint = "logout")]
pub async fn logout() -> Result<(), ServerFnError> {
    use crate::server::guard;
    guard::check_origin()?;
    // The browser is signed out whatever the server can do next: a session
    // check that is refused (PostgreSQL down, this address throttled) must
    // not leave the cookie behind. The answer's headers carry it either way.
    guard::set_cookie(guard::session_cookie(None));
    let caller = guard::current().await.map_err(|e| {
        ServerFnError::new(format!(
            "Signed out of this browser, but the server could not end the session now \
             ({}); it ends when it expires, or sign in and out again to end it now.",
            crate::components::error_text(&e)
        ))
    })?;
    if let Some(caller) = caller {
        holdfast_engine::users::logout(&caller.backends.pg, &caller.session)
            .await
            .map_err(guard::internal("Signing out"))?;
    }
    Ok(())
}

/// The signed-in user, or `None`.
#[server(endpoint = "current_user")]
pub async fn current_user() -> Result<Option<Me>, ServerFnError> {
    use crate::server::{convert, guard};
    Ok(guard::current().await?.map(|c| convert::me(&c.user)))
}

/// Replaces the caller's password (required after a one-time password); the
/// current password must be given.
#[server(endpoint = "change_password")]
pub async fn change_password(
    current_password: String,
    new_password: String,
    repeat: String,
) -> Result<Me, ServerFnError> {
    use crate::server::{convert, guard};
    use http::StatusCode;
    guard::check_origin()?;
    let Some(caller) = guard::current().await? else {
        return Err(guard::refuse(StatusCode::UNAUTHORIZED, "Sign in first."));
    };
    if new_password != repeat {
        return Err(guard::refuse(
            StatusCode::BAD_REQUEST,
            "The two passwords differ.",
        ));
    }
    use holdfast_engine::users::{ChangeError, change_own_password};
    change_own_password(
        &caller.backends,
        &caller.user.username,
        &current_password,
        &new_password,
        guard::client_ip(),
        &caller.session,
    )
    .await
    .map_err(|e| match e {
        ChangeError::WrongCurrent => guard::refuse(StatusCode::FORBIDDEN, e.to_string()),
        ChangeError::User(e) => guard::user_error("Changing the password")(e),
    })?;
    guard::audit(
        &caller,
        "change_password",
        &caller.user.username,
        serde_json::json!({}),
    )
    .await;
    let mut me = convert::me(&caller.user);
    me.must_change_password = false;
    Ok(me)
}

//! Signing in, and choosing a new password after a one-time one.

use leptos::prelude::*;
use leptos_router::components::Redirect;

use crate::MeResource;
use crate::api::auth::{ChangePassword as ChangePasswordFn, Login};
use crate::components::error_text;

/// The login page; a signed-in user is sent to the overview.
#[component]
pub fn LoginPage() -> impl IntoView {
    let me = expect_context::<MeResource>().0;
    let login = ServerAction::<Login>::new();
    Effect::new(move |_| {
        if matches!(login.value().get(), Some(Ok(_))) {
            // A full load, so every resource starts over as the new user.
            #[cfg(feature = "hydrate")]
            let _ = window().location().set_href("/");
        }
    });
    view! {
        <Suspense fallback=|| ()>
            {move || Suspend::new(async move {
                match me.await {
                    Ok(Some(_)) => view! { <Redirect path="/"/> }.into_any(),
                    _ => view! {
                        <section class="login panel">
                            <h1>"Sign in to Holdfast"</h1>
                            <ActionForm action=login>
                                <label>"Username"<input type="text" name="username" autocomplete="username" required autofocus/></label>
                                <label>"Password"<input type="password" name="password" autocomplete="current-password" required/></label>
                                <button type="submit" disabled=move || login.pending().get()>"Sign in"</button>
                            </ActionForm>
                            {move || login.value().get().and_then(Result::err).map(|e| view! {
                                <p class="notice error" role="alert">{error_text(&e)}</p>
                            })}
                        </section>
                    }.into_any(),
                }
            })}
        </Suspense>
    }
}

/// Shown instead of any page while the user is on a one-time password.
#[component]
pub fn ChangePassword() -> impl IntoView {
    let change = ServerAction::<ChangePasswordFn>::new();
    Effect::new(move |_| {
        if matches!(change.value().get(), Some(Ok(_))) {
            #[cfg(feature = "hydrate")]
            let _ = window().location().reload();
        }
    });
    view! {
        <section class="login panel">
            <h1>"Choose your password"</h1>
            <p>"You signed in with a one-time password. Choose your own (at least 10 characters) to continue."</p>
            <ActionForm action=change>
                <label>"One-time password"<input type="password" name="current_password" autocomplete="current-password" required/></label>
                <label>"New password"<input type="password" name="new_password" autocomplete="new-password" required minlength="10"/></label>
                <label>"Repeat it"<input type="password" name="repeat" autocomplete="new-password" required minlength="10"/></label>
                <button type="submit">"Save and continue"</button>
            </ActionForm>
            {move || change.value().get().and_then(Result::err).map(|e| view! {
                <p class="notice error" role="alert">{error_text(&e)}</p>
            })}
        </section>
    }
}

//! Users and API tokens (admin): roles, one-time passwords, token secrets shown
//! once.

use leptos::prelude::*;

use crate::api::admin::{
    CreateToken, CreateUser, DeleteUser, RevokeToken, SetUserRole, list_tokens, list_users,
};
use crate::components::{Outcome, error_text, me, short_time};
use holdfast_domain::Role;

const ROLES: [Role; 4] = Role::ALL;

/// The users and tokens page (`/admin`).
#[component]
pub fn AdminPage() -> impl IntoView {
    let create = ServerAction::<CreateUser>::new();
    let set_role = ServerAction::<SetUserRole>::new();
    let delete = ServerAction::<DeleteUser>::new();
    let users = Resource::new(
        move || {
            (
                create.version().get(),
                set_role.version().get(),
                delete.version().get(),
            )
        },
        |_| list_users(),
    );
    let myself = me().username;
    let changed = Signal::derive(move || {
        set_role
            .value()
            .get()
            .map(|r| r.map(|()| "Role changed.".to_owned()))
            .or_else(|| {
                delete
                    .value()
                    .get()
                    .map(|r| r.map(|()| "User deleted.".to_owned()))
            })
    });
    view! {
        <section>
            <h1>"Users"</h1>
            <Outcome value=changed/>
            <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
                {move || { let myself = myself.clone(); Suspend::new(async move {
                    match users.await {
                        Ok(list) => view! {
                            <div class="table-wrap"><table class="users">
                                <thead><tr><th scope="col">"User"</th><th scope="col">"Role"</th><th scope="col">"Since (UTC)"</th><th scope="col"><span class="sr-only">"Actions"</span></th></tr></thead>
                                <tbody>{list.into_iter().map(|u| {
                                    let name = u.username.clone();
                                    let name2 = u.username.clone();
                                    let is_me = u.username == myself;
                                    view! {
                                        <tr data-user=u.username.clone()>
                                            <td>{u.username.clone()}{u.must_change_password.then_some(" (one-time password)")}</td>
                                            <td><select aria-label=format!("Role of {}", u.username) on:change:target=move |ev| {
                                                if let Some(role) = Role::parse(&ev.target().value()) {
                                                    set_role.dispatch(SetUserRole { username: name.clone(), role });
                                                }
                                            }>
                                                {ROLES.iter().map(|r| view! { <option value=r.as_str() selected=*r == u.role>{r.as_str()}</option> }).collect_view()}
                                            </select></td>
                                            <td>{short_time(&u.created_at)}</td>
                                            <td>{(!is_me).then(|| view! {
                                                <button type="button" class="danger" on:click=move |_| { delete.dispatch(DeleteUser { username: name2.clone() }); }>"Delete"</button>
                                            })}</td>
                                        </tr>
                                    }
                                }).collect_view()}</tbody>
                            </table></div>
                        }.into_any(),
                        Err(e) => view! { <p class="notice error" role="alert">{error_text(&e)}</p> }.into_any(),
                    }
                })}}
            </Transition>
            <h2>"Add a user"</h2>
            <ActionForm action=create attr:class="inline">
                <input type="text" name="username" required placeholder="username" aria-label="Username"/>
                <select name="role" aria-label="Role">
                    {ROLES.iter().map(|r| view! { <option value=r.as_str()>{r.as_str()}</option> }).collect_view()}
                </select>
                <button type="submit">"Add"</button>
            </ActionForm>
            {move || match create.value().get() {
                Some(Ok(password)) => view! {
                    <p class="notice ok" role="status">"User created. Their one-time password (shown once): " <code class="secret">{password}</code></p>
                }.into_any(),
                Some(Err(e)) => view! { <p class="notice error" role="alert">{error_text(&e)}</p> }.into_any(),
                None => ().into_any(),
            }}
            <Tokens/>
        </section>
    }
}

#[component]
fn Tokens() -> impl IntoView {
    let create = ServerAction::<CreateToken>::new();
    let revoke = ServerAction::<RevokeToken>::new();
    let tokens = Resource::new(
        move || (create.version().get(), revoke.version().get()),
        |_| list_tokens(),
    );
    view! {
        <h1>"API tokens"</h1>
        <Outcome value=Signal::derive(move || revoke.value().get().map(|r| r.map(|()| "Token revoked; the API refuses it within five seconds.".to_owned())))/>
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            {move || Suspend::new(async move {
                match tokens.await {
                    Ok(list) if list.is_empty() => view! { <p class="empty">"No API tokens yet."</p> }.into_any(),
                    Ok(list) => view! {
                        <div class="table-wrap"><table class="tokens">
                            <thead><tr><th scope="col">"Id"</th><th scope="col">"Name"</th><th scope="col">"Scopes"</th><th scope="col">"Created (UTC)"</th><th scope="col"><span class="sr-only">"Actions"</span></th></tr></thead>
                            <tbody>{list.into_iter().map(|t| {
                                let id = t.id;
                                view! {
                                    <tr><td>{t.id}</td><td>{t.name}</td><td>{t.scopes.join(", ")}</td><td>{short_time(&t.created_at)}</td>
                                        <td>{if t.revoked {
                                            view! { <span class="muted">"revoked"</span> }.into_any()
                                        } else {
                                            view! { <button type="button" class="danger" on:click=move |_| { revoke.dispatch(RevokeToken { id }); }>"Revoke"</button> }.into_any()
                                        }}</td></tr>
                                }
                            }).collect_view()}</tbody>
                        </table></div>
                    }.into_any(),
                    Err(e) => view! { <p class="notice error" role="alert">{error_text(&e)}</p> }.into_any(),
                }
            })}
        </Transition>
        <h2>"Create a token"</h2>
        <ActionForm action=create attr:class="inline">
            <input type="text" name="name" required placeholder="name, e.g. checkout-prod" aria-label="Token name"/>
            <input type="text" name="scopes" required value="checkout,read" aria-label="Scopes (comma-separated: checkout, ingest, read, catalog)"/>
            <button type="submit">"Create"</button>
        </ActionForm>
        {move || match create.value().get() {
            Some(Ok(t)) => view! {
                <p class="notice ok" role="status">{format!("Token {} created. Its secret (shown once): ", t.token.name)}<code class="secret">{t.secret}</code></p>
            }.into_any(),
            Some(Err(e)) => view! { <p class="notice error" role="alert">{error_text(&e)}</p> }.into_any(),
            None => ().into_any(),
        }}
    }
}

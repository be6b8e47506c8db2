//! Holdfast's dashboard: Leptos components, pages, server functions and the DTOs
//! shared by the server and the browser.
//!
//! The same code renders on the server (feature `ssr`) and hydrates in the browser
//! (feature `hydrate`). Server functions in [`api`] run only on the server, where
//! they check the caller's role and call `holdfast-engine`; in the browser they
//! become HTTP calls. [`live`] holds the tab's one WebSocket.

pub mod api;
pub mod components;
pub mod dto;
pub mod live;
pub mod pages;
#[cfg(feature = "ssr")]
pub mod server;

use leptos::prelude::*;
use leptos_meta::{MetaTags, Stylesheet, Title, provide_meta_context};
use leptos_router::components::{A, Redirect, Route, Router, Routes};
use leptos_router::{SsrMode, path};

use crate::api::auth::{Logout, current_user};
use crate::components::ConnBadge;
use crate::dto::people::Me;
use crate::live::Live;
use holdfast_domain::Permission;

/// The HTML document around the app, rendered once per request on the server.
pub fn shell(options: LeptosOptions) -> impl IntoView {
    // Before anything renders: the hydration scripts carry this page's nonce.
    #[cfg(feature = "ssr")]
    server::csp::for_this_page();
    view! {
        <!DOCTYPE html>
        <html lang="en">
            <head>
                <meta charset="utf-8"/>
                <meta name="viewport" content="width=device-width, initial-scale=1"/>
                <AutoReload options=options.clone()/>
                <HydrationScripts options/>
                <link rel="icon" href="/favicon.svg" type="image/svg+xml"/>
                <MetaTags/>
            </head>
            <body>
                <App/>
            </body>
        </html>
    }
}

/// The signed-in user as loaded once per page load.
#[derive(Clone, Copy)]
pub struct MeResource(pub Resource<Result<Option<Me>, ServerFnError>>);

/// The root component: stylesheet, title, top bar and the page routes.
///
/// Pages render whole before the response starts (`SsrMode::Async`), so a
/// signed-out visitor gets a real redirect to `/login`, not a page that only
/// redirects once its script runs.
#[component]
pub fn App() -> impl IntoView {
    provide_meta_context();
    provide_context(Live::new());
    provide_context(MeResource(Resource::new(|| (), |_| current_user())));
    // Effects run only in the browser, so this flips once the WASM has hydrated
    // the page; end-to-end tests wait for it before using the controls.
    let hydrated = RwSignal::new(false);
    Effect::new(move |_| hydrated.set(true));

    view! {
        <Stylesheet id="holdfast" href="/pkg/holdfast.css"/>
        <Title text="Holdfast"/>
        <Router>
            <TopBar/>
            <main class="page" data-hydrated=move || hydrated.get().to_string()>
                <Routes fallback=|| view! { <p class="empty">"Page not found."</p> }>
                    <Route path=path!("/login") view=pages::login::LoginPage ssr=SsrMode::Async/>
                    <Route path=path!("/") view=|| view! { <Authed><pages::overview::OverviewPage/></Authed> } ssr=SsrMode::Async/>
                    <Route path=path!("/sku/:sku") view=|| view! { <Authed><pages::sku::SkuPage/></Authed> } ssr=SsrMode::Async/>
                    <Route path=path!("/reservations") view=|| view! { <Authed><pages::reservations::ReservationsPage/></Authed> } ssr=SsrMode::Async/>
                    <Route path=path!("/locks") view=|| view! { <Authed><pages::locks::LocksPage/></Authed> } ssr=SsrMode::Async/>
                    <Route path=path!("/ingestion") view=|| view! { <Authed><pages::ingestion::IngestionPage/></Authed> } ssr=SsrMode::Async/>
                    <Route path=path!("/operations") view=|| view! { <Authed><pages::operations::OperationsPage/></Authed> } ssr=SsrMode::Async/>
                    <Route path=path!("/reserve") view=|| view! { <Authed need=Permission::Operate><pages::reserve::ReservePage/></Authed> } ssr=SsrMode::Async/>
                    <Route path=path!("/report") view=|| view! { <Authed><pages::report::ReportPage/></Authed> } ssr=SsrMode::Async/>
                    <Route path=path!("/wall") view=|| view! { <Authed><pages::wall::WallPage/></Authed> } ssr=SsrMode::Async/>
                    <Route path=path!("/drops") view=|| view! { <Authed need=Permission::EditDrops><pages::drops::DropsPage/></Authed> } ssr=SsrMode::Async/>
                    <Route path=path!("/audit") view=|| view! { <Authed need=Permission::Operate><pages::audit::AuditPage/></Authed> } ssr=SsrMode::Async/>
                    <Route path=path!("/admin") view=|| view! { <Authed need=Permission::ManageAccess><pages::admin::AdminPage/></Authed> } ssr=SsrMode::Async/>
                </Routes>
            </main>
        </Router>
    }
}

/// Renders `children` for a signed-in user whose role may do `need`; sends others to
/// the login page, and a user on a one-time password to choose their own first.
/// Starts the tab's live connection.
#[component]
pub fn Authed(
    /// What the page lets a user do.
    #[prop(default = Permission::View)]
    need: Permission,
    /// The page.
    children: ChildrenFn,
) -> impl IntoView {
    let me = expect_context::<MeResource>().0;
    let children = StoredValue::new(children);
    view! {
        <Suspense fallback=|| view! { <p class="muted">"Loading…"</p> }>
            {move || Suspend::new(async move {
                match me.await {
                    Ok(Some(user)) if user.must_change_password => {
                        view! { <pages::login::ChangePassword/> }.into_any()
                    }
                    Ok(Some(user)) if !user.may(need) => view! {
                        <p class="notice error" role="alert">
                            {format!("This page is for {}, which your role ({}) does not allow.", need.describe(), user.role.as_str())}
                        </p>
                    }.into_any(),
                    Ok(Some(user)) => {
                        provide_context(user);
                        let live = expect_context::<Live>();
                        Effect::new(move |_| live.start());
                        children.read_value()().into_any()
                    }
                    Ok(None) => view! { <Redirect path="/login"/> }.into_any(),
                    Err(e) => view! {
                        <p class="notice error" role="alert">{components::error_text(&e)}</p>
                    }.into_any(),
                }
            })}
        </Suspense>
    }
}

/// Navigation for the signed-in user's role, the connection state and sign-out.
#[component]
fn TopBar() -> impl IntoView {
    let me = expect_context::<MeResource>().0;
    // The wall view is for a screen on the wall: no navigation.
    let location = leptos_router::hooks::use_location();
    let on_wall = move || location.pathname.get().starts_with("/wall");
    let logout = ServerAction::<Logout>::new();
    Effect::new(move |_| {
        if logout.value().get().is_some() {
            #[cfg(feature = "hydrate")]
            let _ = window().location().set_href("/login");
        }
    });
    view! {
        <header class="topbar" style:display=move || if on_wall() { "none" } else { "" }>
            <a class="brand" href="/">"Holdfast"</a>
            <Transition fallback=|| ()>
                {move || Suspend::new(async move {
                    match me.await {
                        Ok(Some(user)) if !user.must_change_password => {
                            let operate = user.may(Permission::Operate);
                            let access = user.may(Permission::ManageAccess);
                            let drops = user.may(Permission::EditDrops);
                            view! {
                                <nav aria-label="Main">
                                    <A href="/">"Overview"</A>
                                    <A href="/reservations">"Reservations"</A>
                                    <A href="/locks">"Locks"</A>
                                    <A href="/ingestion">"Ingestion"</A>
                                    <A href="/operations">"Reconcile & warm-up"</A>
                                    {drops.then(|| view! { <A href="/drops">"Drops"</A> })}
                                    {operate.then(|| view! {
                                        <A href="/reserve">"Reserve tool"</A>
                                        <A href="/audit">"Audit log"</A>
                                    })}
                                    {access.then(|| view! { <A href="/admin">"Users & tokens"</A> })}
                                </nav>
                                <span class="who">
                                    <ConnBadge/>
                                    <span class="user" data-role=user.role.as_str()>{format!("{} ({})", user.username, user.role.as_str())}</span>
                                    <ActionForm action=logout>
                                        <button type="submit" class="link">"Sign out"</button>
                                    </ActionForm>
                                </span>
                            }.into_any()
                        }
                        _ => view! { <span class="tagline">"live stock for flash sales"</span> }.into_any(),
                    }
                })}
            </Transition>
        </header>
    }
}

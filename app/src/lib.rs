//! Holdfast's dashboard: Leptos components, pages, server functions and the DTOs
//! shared by the server and the browser.
//!
//! The same code renders on the server (feature `ssr`) and hydrates in the browser
//! (feature `hydrate`). Server functions in [`api`] run only on the server, where
//! they call `holdfast-engine`; in the browser they become HTTP calls.

pub mod api;
pub mod dto;
pub mod pages;

use leptos::prelude::*;
use leptos_meta::{MetaTags, Stylesheet, Title, provide_meta_context};
use leptos_router::{
    StaticSegment,
    components::{Route, Router, Routes},
};

/// The HTML document around the app, rendered once per request on the server.
pub fn shell(options: LeptosOptions) -> impl IntoView {
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

/// The root component: stylesheet, title and the page routes.
#[component]
pub fn App() -> impl IntoView {
    provide_meta_context();
    view! {
        <Stylesheet id="holdfast" href="/pkg/holdfast.css"/>
        <Title text="Holdfast"/>
        <Router>
            <header class="topbar">
                <a class="brand" href="/">"Holdfast"</a>
                <span class="tagline">"live stock for flash sales"</span>
            </header>
            <main class="page">
                <Routes fallback=|| view! { <p class="empty">"Page not found."</p> }>
                    <Route path=StaticSegment("") view=pages::home::HomePage/>
                </Routes>
            </main>
        </Router>
    }
}

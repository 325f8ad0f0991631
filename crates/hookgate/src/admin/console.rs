//! The console: server-rendered pages over the admin operations, without JavaScript. Every
//! value is auto-escaped by minijinja (the templates are HTML), since keys, bodies and CRM
//! answers come from senders and CRMs. Actions are forms that POST with a CSRF field and
//! redirect back (post/redirect/get); the session cookie is `HttpOnly` and `SameSite=Strict`.

use axum::Form;
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use hookgate_store::{DeliveryOutcome, EventFilter, EventState, ItemState};
use minijinja::{AutoEscape, Environment, context};
use serde::Deserialize;
use serde_json::Value;

use super::api::{self, DeadLettersQuery, Failure, ReplayRequest};
use super::{Admin, SESSION_COOKIE, SESSION_SECS};
use crate::events;
use crate::output::Bodies;

/// Rows per console page.
const ROWS: i64 = 50;
const PAGE_ROWS: usize = ROWS as usize;

/// The templates, compiled once.
pub struct Pages {
    env: Environment<'static>,
}

impl Pages {
    pub fn new() -> Pages {
        let mut env = Environment::new();
        env.set_auto_escape_callback(|_| AutoEscape::Html);
        for (name, source) in [
            ("layout.html", include_str!("templates/layout.html")),
            ("login.html", include_str!("templates/login.html")),
            ("events.html", include_str!("templates/events.html")),
            ("event.html", include_str!("templates/event.html")),
            ("dead_letters.html", include_str!("templates/dead_letters.html")),
            ("pipelines.html", include_str!("templates/pipelines.html")),
            ("conflicts.html", include_str!("templates/conflicts.html")),
            ("refused.html", include_str!("templates/refused.html")),
        ] {
            env.add_template(name, source).expect("the console's templates compile");
        }
        Pages { env }
    }

    fn render(&self, name: &str, context: minijinja::Value) -> Response {
        match self.env.get_template(name).and_then(|t| t.render(context)) {
            Ok(html) => Html(html).into_response(),
            Err(error) => {
                tracing::error!(%error, page = name, "console: a page failed to render");
                (StatusCode::INTERNAL_SERVER_ERROR, "the page failed to render; the log says why")
                    .into_response()
            }
        }
    }
}

impl std::fmt::Debug for Pages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pages").finish_non_exhaustive()
    }
}

pub(super) fn routes(admin: Admin) -> Router {
    // Checked before anything of the request is read: a form's body is not parsed for a
    // caller without a session.
    let signed_in = Router::new()
        .route("/console/events", get(events_page))
        .route("/console/events/{id}", get(event_page))
        .route("/console/conflicts", get(conflicts_page))
        .route("/console/refused", get(refused_page))
        .route("/console/dead-letters", get(dead_letters_page))
        .route("/console/pipelines", get(pipelines_page))
        .route("/console/replay", post(replay))
        .route("/console/pause", post(pause))
        .layer(axum::middleware::from_fn_with_state(admin.clone(), console_auth));
    Router::new()
        .route("/", get(|| async { Redirect::to("/console/events") }))
        .route("/console", get(|| async { Redirect::to("/console/events") }))
        .route("/console/login", get(login_page).post(login))
        .route("/console/logout", post(logout))
        .merge(signed_in)
        .with_state(admin)
}

/// The console's door: the session cookie (or the bearer token); otherwise the login form,
/// with 401.
async fn console_auth(
    State(admin): State<Admin>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if admin.session_ok(request.headers()) || admin.bearer_ok(request.headers()) {
        return next.run(request).await;
    }
    let mut page = admin.console.render("login.html", context! { failed => false });
    *page.status_mut() = StatusCode::UNAUTHORIZED;
    page
}

/// Rows and stories for a template.
fn data<T: serde::Serialize>(value: &T) -> minijinja::Value {
    minijinja::Value::from(minijinja::value::Serde(value))
}

/// A failure as a page, in the layout.
fn failure_page(admin: &Admin, failure: Failure) -> Response {
    let (status, message) = failure.parts();
    let mut page = admin.console.render(
        "layout.html",
        context! { title => "Error", error => message, csrf => admin.csrf.clone() },
    );
    *page.status_mut() = status;
    page
}

async fn login_page(State(admin): State<Admin>) -> Response {
    admin.console.render("login.html", context! { failed => false })
}

#[derive(Debug, Deserialize)]
struct LoginForm {
    token: String,
}

async fn login(State(admin): State<Admin>, Form(form): Form<LoginForm>) -> Response {
    if !admin.token_ok(&form.token) {
        let mut page = admin.console.render("login.html", context! { failed => true });
        *page.status_mut() = StatusCode::UNAUTHORIZED;
        return page;
    }
    let cookie = format!(
        "{SESSION_COOKIE}={}; HttpOnly; SameSite=Strict; Path=/; Max-Age={SESSION_SECS}",
        admin.new_session()
    );
    let mut response = Redirect::to("/console/events").into_response();
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

async fn logout() -> Response {
    let mut response = Redirect::to("/console/login").into_response();
    let cookie = format!("{SESSION_COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0");
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

#[derive(Debug, Default, Deserialize)]
struct ListQuery {
    pipeline: Option<String>,
    target: Option<String>,
    state: Option<String>,
    after: Option<i64>,
    notice: Option<String>,
}

/// An empty form field is no filter.
fn filled(value: Option<String>) -> Option<String> {
    value.filter(|v| !v.trim().is_empty())
}

async fn events_page(State(admin): State<Admin>, Query(q): Query<ListQuery>) -> Response {
    let (pipeline, state) = (filled(q.pipeline), filled(q.state));
    let parsed = match state.as_deref().map(|text| (text, EventState::parse(text))) {
        None => None,
        Some((_, Some(parsed))) => Some(parsed),
        Some((text, None)) => {
            return failure_page(&admin, Failure::bad(format!("unknown state `{text}`")));
        }
    };
    let filter = EventFilter {
        pipeline: pipeline.clone(),
        state: parsed,
        since_ms: None,
        before_id: q.after,
        limit: ROWS + 1,
    };
    let rows = match admin.gateway.store().list_events(&filter).await {
        Ok(rows) => rows,
        Err(error) => return failure_page(&admin, error.into()),
    };
    let more = rows.len() > PAGE_ROWS;
    let rows: Vec<Value> = rows.iter().take(PAGE_ROWS).map(events::event_json).collect();
    let next = if more { rows.last().and_then(|r| r["id"].as_i64()) } else { None };
    let pipelines = admin.gateway.pipeline_names();
    admin.console.render(
        "events.html",
        context! {
            title => "Events", nav => "events", csrf => admin.csrf.clone(), notice => q.notice,
            events => data(&rows), next => next, pipelines => data(&pipelines), states => data(&EventState::ALL),
            pipeline => pipeline, state => state,
        },
    )
}

async fn event_page(State(admin): State<Admin>, Path(id): Path<i64>) -> Response {
    let store = admin.gateway.store();
    let event = match store.event(id).await {
        Ok(Some(event)) => event,
        Ok(None) => return failure_page(&admin, Failure::not_found(format!("no event {id}"))),
        Err(error) => return failure_page(&admin, error.into()),
    };
    let story = match events::story_value(store, &admin.views(), &event, Bodies::Shown).await {
        Ok(story) => story,
        Err(error) => return failure_page(&admin, error.into()),
    };
    let dead = story["writes"]
        .as_array()
        .is_some_and(|writes| writes.iter().any(|w| w["state"] == ItemState::Dead.as_str()));
    admin.console.render(
        "event.html",
        context! { title => format!("Event {id}"), nav => "events", csrf => admin.csrf.clone(), story => data(&story), dead => dead },
    )
}

async fn conflicts_page(State(admin): State<Admin>, Query(q): Query<ListQuery>) -> Response {
    let store = admin.gateway.store();
    let pipeline = filled(q.pipeline);
    let rows = match store
        .deliveries_page(DeliveryOutcome::Conflict, pipeline.as_deref(), q.after, ROWS + 1)
        .await
    {
        Ok(rows) => rows,
        Err(error) => return failure_page(&admin, error.into()),
    };
    let more = rows.len() > PAGE_ROWS;
    let ids: Vec<i64> = rows.iter().filter_map(|d| d.event_id).collect();
    let originals = match store.fingerprints(&ids).await {
        Ok(events) => events,
        Err(error) => return failure_page(&admin, error.into()),
    };
    let rows: Vec<Value> = rows
        .iter()
        .take(PAGE_ROWS)
        .map(|d| {
            let original = originals.iter().find(|(id, _)| Some(*id) == d.event_id);
            serde_json::json!({
                "id": d.id, "event_id": d.event_id, "pipeline": d.pipeline, "key": d.event_key,
                "received_at": events::timestamp(d.received_at_ms), "fingerprint": d.fingerprint,
                "original_fingerprint": original.map(|(_, fingerprint)| fingerprint.clone()),
            })
        })
        .collect();
    let next = if more { rows.last().and_then(|r| r["id"].as_i64()) } else { None };
    admin.console.render(
        "conflicts.html",
        context! { title => "Conflicts", nav => "conflicts", csrf => admin.csrf.clone(), conflicts => data(&rows), next => next },
    )
}

async fn refused_page(State(admin): State<Admin>, Query(q): Query<ListQuery>) -> Response {
    let pipeline = filled(q.pipeline);
    let rows = match admin.gateway.store().signature_refusals(pipeline.as_deref(), ROWS).await {
        Ok(rows) => rows,
        Err(error) => return failure_page(&admin, error.into()),
    };
    let rows: Vec<Value> = rows.iter().map(events::refusal_json).collect();
    admin.console.render(
        "refused.html",
        context! { title => "Refused", nav => "refused", csrf => admin.csrf.clone(), refused => data(&rows) },
    )
}

async fn dead_letters_page(State(admin): State<Admin>, Query(q): Query<ListQuery>) -> Response {
    let (pipeline, target) = (filled(q.pipeline), filled(q.target));
    let query = DeadLettersQuery {
        pipeline: pipeline.clone(),
        target: target.clone(),
        limit: Some(ROWS),
        after: q.after,
    };
    match api::dead_letters(&admin, query).await {
        Ok(page) => admin.console.render(
            "dead_letters.html",
            context! {
                title => "Dead letters", nav => "dead", csrf => admin.csrf.clone(), notice => q.notice,
                letters => data(&page.dead_letters), next => page.more.map(|m| m.after),
                pipeline => pipeline, target => target,
            },
        ),
        Err(failure) => failure_page(&admin, failure),
    }
}

async fn pipelines_page(State(admin): State<Admin>, Query(q): Query<ListQuery>) -> Response {
    match api::pipelines(&admin).await {
        Ok(answer) => admin.console.render(
            "pipelines.html",
            context! {
                title => "Pipelines", nav => "pipelines", csrf => admin.csrf.clone(), notice => q.notice,
                pipelines => data(&answer.pipelines),
            },
        ),
        Err(failure) => failure_page(&admin, failure),
    }
}

#[derive(Debug, Deserialize)]
struct ReplayForm {
    csrf: String,
    event_id: Option<String>,
    pipeline: Option<String>,
    target: Option<String>,
    /// `true` on the form that replays every dead write shown.
    all: Option<String>,
    /// Where to go back to.
    back: Option<String>,
}

async fn replay(State(admin): State<Admin>, Form(form): Form<ReplayForm>) -> Response {
    if !admin.csrf_ok(&form.csrf) {
        return StatusCode::FORBIDDEN.into_response();
    }
    let event_id = match filled(form.event_id).map(|id| id.parse::<i64>()) {
        None => None,
        Some(Ok(id)) => Some(id),
        Some(Err(_)) => return failure_page(&admin, Failure::bad("event_id: not a number")),
    };
    let (pipeline, target) = (filled(form.pipeline), filled(form.target));
    let request = ReplayRequest {
        // "Everything" only when the form says so, as the API requires.
        all: Some(form.all.as_deref() == Some("true")),
        event_ids: event_id.map(|id| vec![id]),
        pipeline,
        target,
        ..ReplayRequest::default()
    };
    match api::replay(&admin, request).await {
        Ok(answer) => {
            let mut notice = format!(
                "Queued {} write(s) of {} event(s) again.",
                answer.queued,
                answer.events.len()
            );
            if answer.more {
                notice.push_str(" More match: replay again for the next ones.");
            }
            back_to(form.back.as_deref(), "/console/dead-letters", &notice)
        }
        Err(failure) => failure_page(&admin, failure),
    }
}

#[derive(Debug, Deserialize)]
struct PauseForm {
    csrf: String,
    pipeline: String,
    target: Option<String>,
    /// `pause` or `resume`.
    action: String,
    reason: Option<String>,
}

async fn pause(State(admin): State<Admin>, Form(form): Form<PauseForm>) -> Response {
    if !admin.csrf_ok(&form.csrf) {
        return StatusCode::FORBIDDEN.into_response();
    }
    let paused = match form.action.as_str() {
        "pause" => true,
        "resume" => false,
        other => {
            return failure_page(
                &admin,
                Failure::bad(format!("action `{other}`: pause or resume")),
            );
        }
    };
    let target = filled(form.target);
    match api::set_pause(&admin, &form.pipeline, target.as_deref(), paused, filled(form.reason))
        .await
    {
        Ok(answer) => {
            let what = match &answer.target {
                Some(target) => format!("delivery to {}/{target}", answer.pipeline),
                None => format!("intake of {}", answer.pipeline),
            };
            let notice = format!("{} {what}.", if paused { "Paused" } else { "Resumed" });
            back_to(None, "/console/pipelines", &notice)
        }
        Err(failure) => failure_page(&admin, failure),
    }
}

/// A redirect to a console page (never elsewhere) with a notice.
fn back_to(back: Option<&str>, default: &str, notice: &str) -> Response {
    // A console path of plain characters only: never another site, never a header break.
    let safe = |b: &&str| {
        b.starts_with("/console/")
            && !b.contains("//")
            && b.bytes().all(|c| c.is_ascii_alphanumeric() || b"/-_".contains(&c))
    };
    let page = back.filter(safe).unwrap_or(default);
    let notice: String = form_urlencoded::byte_serialize(notice.as_bytes()).collect();
    Redirect::to(&format!("{page}?notice={notice}")).into_response()
}

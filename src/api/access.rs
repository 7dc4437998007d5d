//! Who may call each route, declared where the route is registered: every router adds its
//! routes through [`AccessRouter::routes`] with an [`Access`], which goes into one
//! [`AccessTable`] that the auth layer reads by the matched route. A route registered
//! without a declaration is refused to every caller (and fails `every_route_declares_who_may_call_it`).

use std::collections::BTreeMap;

use axum::http::Method;
use utoipa::openapi::path::PathItem;
use utoipa_axum::router::{OpenApiRouter, UtoipaMethodRouter};

use super::AppState;
use crate::model::{Role, StudyId, TrialKey};

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone, without a token: health checks, the login form, the dashboard's assets.
    Public,
    /// A token of at least this role (the service may ask more: its creator to change a
    /// study, an operator for a `trial_job`).
    Role(Role),
    /// A token of at least this role, or the token of the trial the path names
    /// (`…/trials/{trial}`): what a trial's own process reads and reports.
    RoleOrOwnTrial(Role),
}

/// Every declared route: method and path template (as registered, `/v1/studies/{study}`)
/// to who may call it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AccessTable {
    routes: BTreeMap<(String, String), Access>,
}

/// What the auth layer learns of a request's route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteAccess {
    Declared(Access),
    /// The path is no route (the answer will be 404), or not with this method (405).
    Unknown,
    /// A route registered without a declaration: refused to everyone.
    Undeclared,
}

impl AccessTable {
    /// Who may call `method` on the route whose template is `template`; `None`: the request
    /// matched no route.
    pub fn lookup(&self, method: &Method, template: Option<&str>) -> RouteAccess {
        let Some(template) = template else {
            return RouteAccess::Unknown;
        };
        // HEAD is answered by GET's handler.
        let method = if method == Method::HEAD {
            "GET"
        } else {
            method.as_str()
        };
        match self.routes.get(&(method.to_string(), template.to_string())) {
            Some(access) => RouteAccess::Declared(*access),
            None if self.routes.keys().any(|(_, t)| t == template) => RouteAccess::Unknown,
            None => RouteAccess::Undeclared,
        }
    }

    /// Every declared route, `(METHOD, template, access)`, in order: for tests and docs.
    pub fn entries(&self) -> impl Iterator<Item = (&str, &str, Access)> {
        self.routes
            .iter()
            .map(|((m, t), a)| (m.as_str(), t.as_str(), *a))
    }

    fn merge(&mut self, other: AccessTable) {
        self.routes.extend(other.routes);
    }
}

/// An `OpenApiRouter` whose routes each declare their [`Access`].
pub struct AccessRouter {
    router: OpenApiRouter<AppState>,
    table: AccessTable,
}

impl Default for AccessRouter {
    fn default() -> Self {
        Self::new()
    }
}

impl AccessRouter {
    pub fn new() -> Self {
        Self::with_openapi(utoipa::openapi::OpenApi::default())
    }

    /// A router that starts from this document (its info, components, security).
    pub fn with_openapi(doc: utoipa::openapi::OpenApi) -> Self {
        Self {
            router: OpenApiRouter::with_openapi(doc),
            table: AccessTable::default(),
        }
    }

    /// Add `routes` (one path, one or more methods: `routes!(a, b)`), each callable as
    /// `access` says. Routes of one path with different access are added one by one.
    pub fn routes(mut self, access: Access, routes: UtoipaMethodRouter<AppState>) -> Self {
        for (path, item) in routes.1.paths.iter() {
            for method in methods_of(item) {
                self.table
                    .routes
                    .insert((method.to_string(), path.clone()), access);
            }
        }
        self.router = self.router.routes(routes);
        self
    }

    /// Add a route kept out of the OpenAPI document (another protocol's, `api::vizier`):
    /// `methods` names each method `router` answers with who may call it.
    pub fn undocumented(
        mut self,
        path: &str,
        methods: &[(Method, Access)],
        router: axum::routing::MethodRouter<AppState>,
    ) -> Self {
        for (method, access) in methods {
            self.table
                .routes
                .insert((method.to_string(), path.to_string()), *access);
        }
        self.router = self.router.route(path, router);
        self
    }

    pub fn merge(mut self, other: AccessRouter) -> Self {
        self.router = self.router.merge(other.router);
        self.table.merge(other.table);
        self
    }

    /// The router with its OpenAPI document, and the table of who may call what.
    pub fn into_parts(self) -> (OpenApiRouter<AppState>, AccessTable) {
        (self.router, self.table)
    }
}

fn methods_of(item: &PathItem) -> Vec<&'static str> {
    [
        ("GET", item.get.is_some()),
        ("POST", item.post.is_some()),
        ("PUT", item.put.is_some()),
        ("PATCH", item.patch.is_some()),
        ("DELETE", item.delete.is_some()),
        ("HEAD", item.head.is_some()),
        ("OPTIONS", item.options.is_some()),
    ]
    .into_iter()
    .filter_map(|(m, present)| present.then_some(m))
    .collect()
}

/// The trial a path names where its template has `{study}` and `{trial}`.
pub fn trial_of_path(template: &str, path: &str) -> Option<TrialKey> {
    let (mut study, mut trial) = (None, None);
    let mut parts = path.trim_end_matches('/').split('/');
    for name in template.split('/') {
        let part = parts.next()?;
        match name {
            "{study}" => study = part.parse().ok(),
            "{trial}" => trial = part.parse().ok(),
            _ => {}
        }
    }
    Some(TrialKey::new(study?, trial?))
}

/// The study a request changes, from its route: any method but GET, HEAD and OPTIONS on a
/// route under `/v1/studies/{study}`. Replicas send such requests to the study's owner.
pub fn study_changed(method: &Method, template: &str, path: &str) -> Option<StudyId> {
    let Some(rest) = template.strip_prefix("/v1/studies/{study}") else {
        return vizier_study_changed(method, template, path);
    };
    if !(rest.is_empty() || rest.starts_with('/')) {
        return None;
    }
    // The route is one of a study's: its id as clients read it from the path.
    crate::model::request::study_changed_by(method.as_str(), path)
}

/// The same for Vertex's Vizier routes (`api/vizier`): a change (not GET, HEAD or OPTIONS)
/// on a route under `/{v1,v1beta1}/projects/{project}/locations/{location}/studies/{study}`,
/// the study's id being the path's segment after `studies/`. An operation's `:wait` and
/// `:cancel` only read, and stay where they arrive.
fn vizier_study_changed(method: &Method, template: &str, path: &str) -> Option<StudyId> {
    if [Method::GET, Method::HEAD, Method::OPTIONS].contains(method) {
        return None;
    }
    let rest = ["/v1/", "/v1beta1/"]
        .iter()
        .find_map(|v| template.strip_prefix(v))?
        .strip_prefix("projects/{project}/locations/{location}/studies/{study}")?;
    if !(rest.is_empty() || rest.starts_with('/')) || rest.contains("/operations/") {
        return None;
    }
    let (_, after) = path.split_once("/studies/")?;
    let id = after.split(['/', ':', '?']).next()?;
    id.parse().ok().filter(|id: &StudyId| id.get() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TrialId;

    #[test]
    fn a_trials_ids_come_from_the_places_its_template_names() {
        let t = "/v1/studies/{study}/trials/{trial}/complete";
        assert_eq!(
            trial_of_path(t, "/v1/studies/3/trials/7/complete"),
            Some(TrialKey::new(StudyId::new(3), TrialId::new(7)))
        );
        assert_eq!(trial_of_path(t, "/v1/studies/3/trials/x/complete"), None);
        assert_eq!(trial_of_path("/v1/studies/{study}", "/v1/studies/3"), None);
    }

    #[test]
    fn a_route_without_a_declaration_is_refused_and_unknown_paths_need_a_token() {
        let mut table = AccessTable::default();
        table.routes.insert(
            ("GET".into(), "/v1/studies/{study}".into()),
            Access::Role(Role::Reader),
        );
        let get = |t| table.lookup(&Method::GET, t);
        assert_eq!(
            get(Some("/v1/studies/{study}")),
            RouteAccess::Declared(Access::Role(Role::Reader))
        );
        assert_eq!(
            table.lookup(&Method::HEAD, Some("/v1/studies/{study}")),
            RouteAccess::Declared(Access::Role(Role::Reader)),
            "HEAD as GET"
        );
        // Another method of a declared path: 405 to come, after a token.
        assert_eq!(
            table.lookup(&Method::PUT, Some("/v1/studies/{study}")),
            RouteAccess::Unknown
        );
        assert_eq!(get(None), RouteAccess::Unknown, "no route: 404 to come");
        // Registered around `AccessRouter::routes`: refused to everyone.
        assert_eq!(get(Some("/v1/secret")), RouteAccess::Undeclared);
    }

    #[test]
    fn only_changes_under_a_study_go_to_its_owner() {
        let post = Method::POST;
        assert_eq!(
            study_changed(
                &post,
                "/v1/studies/{study}/suggest",
                "/v1/studies/7/suggest"
            ),
            Some(StudyId::new(7))
        );
        assert_eq!(
            study_changed(&Method::PATCH, "/v1/studies/{study}", "/v1/studies/12"),
            Some(StudyId::new(12))
        );
        assert_eq!(
            study_changed(&Method::GET, "/v1/studies/{study}", "/v1/studies/12"),
            None
        );
        assert_eq!(study_changed(&post, "/v1/studies", "/v1/studies"), None);
        assert_eq!(study_changed(&post, "/v1/tokens", "/v1/tokens"), None);
    }

    #[test]
    fn vizier_changes_of_a_study_go_to_its_owner_as_the_rest_apis_do() {
        let parent = "/projects/{project}/locations/{location}";
        let study = format!("/v1{parent}/studies/{{study}}");
        let path = "/v1/projects/p/locations/l/studies/7";
        assert_eq!(
            study_changed(
                &Method::POST,
                &format!("{study}/trials:suggest"),
                &format!("{path}/trials:suggest")
            ),
            Some(StudyId::new(7))
        );
        assert_eq!(
            study_changed(
                &Method::POST,
                &format!("/v1beta1{parent}/studies/{{study}}/trials/{{trial}}"),
                "/v1beta1/projects/p/locations/l/studies/8/trials/2:complete"
            ),
            Some(StudyId::new(8))
        );
        assert_eq!(
            study_changed(&Method::DELETE, &study, path),
            Some(StudyId::new(7))
        );
        assert_eq!(study_changed(&Method::GET, &study, path), None, "a read");
        assert_eq!(
            study_changed(
                &Method::POST,
                &format!("/v1{parent}/studies"),
                "/v1/projects/p/locations/l/studies"
            ),
            None,
            "a create has no owner yet"
        );
        assert_eq!(
            study_changed(
                &Method::POST,
                &format!("{study}/operations/{{operation}}"),
                &format!("{path}/operations/suggest-1:wait")
            ),
            None
        );
    }
}

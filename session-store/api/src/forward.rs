//! A `SessionStore` that wraps another, with its forwarding written once:
//! [`forward_store!`](crate::forward_store) writes the trait's signatures
//! and the calls to the wrapped store, and [`StoreOperation`] names each
//! operation of the trait for the wrappers that tell them apart (metrics,
//! fencing).

/// What `forward_store!`'s expansion names; not part of the API.
#[doc(hidden)]
pub use async_trait::async_trait as __async_trait;

/// Every operation of the `SessionStore` trait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoreOperation {
    AcquireWriter,
    ReleaseWriter,
    Append,
    History,
    GetSession,
    ListSessions,
    ResetSession,
    DeleteSession,
    PatchSession,
    CreateRun,
    UpdateRun,
    StartRun,
    FinishRun,
    GetRun,
    ListActiveRuns,
    PurgeExpiredRuns,
    AcquireLeases,
    RenewLeases,
    ReleaseLeases,
    ListLeases,
    HeartbeatMember,
    LeaveMember,
    ListMembers,
}

impl StoreOperation {
    /// Every operation, in declaration order: `ALL[op as usize] == op`, so
    /// a table indexed by `op as usize` can be built from it.
    pub const ALL: [Self; 23] = [
        Self::AcquireWriter,
        Self::ReleaseWriter,
        Self::Append,
        Self::History,
        Self::GetSession,
        Self::ListSessions,
        Self::ResetSession,
        Self::DeleteSession,
        Self::PatchSession,
        Self::CreateRun,
        Self::UpdateRun,
        Self::StartRun,
        Self::FinishRun,
        Self::GetRun,
        Self::ListActiveRuns,
        Self::PurgeExpiredRuns,
        Self::AcquireLeases,
        Self::RenewLeases,
        Self::ReleaseLeases,
        Self::ListLeases,
        Self::HeartbeatMember,
        Self::LeaveMember,
        Self::ListMembers,
    ];

    /// The trait method's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AcquireWriter => "acquire_writer",
            Self::ReleaseWriter => "release_writer",
            Self::Append => "append",
            Self::History => "history",
            Self::GetSession => "get_session",
            Self::ListSessions => "list_sessions",
            Self::ResetSession => "reset_session",
            Self::DeleteSession => "delete_session",
            Self::PatchSession => "patch_session",
            Self::CreateRun => "create_run",
            Self::UpdateRun => "update_run",
            Self::StartRun => "start_run",
            Self::FinishRun => "finish_run",
            Self::GetRun => "get_run",
            Self::ListActiveRuns => "list_active_runs",
            Self::PurgeExpiredRuns => "purge_expired_runs",
            Self::AcquireLeases => "acquire_leases",
            Self::RenewLeases => "renew_leases",
            Self::ReleaseLeases => "release_leases",
            Self::ListLeases => "list_leases",
            Self::HeartbeatMember => "heartbeat_member",
            Self::LeaveMember => "leave_member",
            Self::ListMembers => "list_members",
        }
    }
}

/// Implements `SessionStore` for a wrapper: the methods it writes itself,
/// and every other one forwarded to the store it wraps.
///
/// ```ignore
/// forward_store! {
///     impl[S: SessionStore] SessionStore for Checked<S> {
///         async fn append(&self, req: AppendEntries) -> StoreResult<Appended> {
///             self.limits.check_entries(&req.entries)?;
///             self.inner.append(req).await
///         }
///     }
///     forward(self => self.inner) [history, get_session, /* … */];
///     forward(self => self.inner, through timed) [create_run];
/// }
/// ```
///
/// `impl[…]` holds the impl's generic parameters. Each `forward` group
/// names methods and where they go: `self => <expr>` is the wrapped store
/// (`self` is written out so that it is the method's own); with
/// `through hook`, each call is `self.hook(StoreOperation::…, call)` and
/// `hook` answers the call's future's result (an async fn taking the
/// operation and the future). A method left out, or named twice, is a
/// compile error, so a method added to the trait is placed in every
/// wrapper on purpose.
#[macro_export]
macro_rules! forward_store {
    (
        $(#[$attr:meta])*
        impl [$($generics:tt)*] SessionStore for $wrapper:ty { $($own:tt)* }
        $($groups:tt)*
    ) => {
        $crate::forward_store!(@group [$(#[$attr])*] [$($generics)*] $wrapper; { $($own)* }; [];
            $($groups)*);
    };

    // The next group: its methods, one by one.
    (@group $attrs:tt $generics:tt $wrapper:ty; $own:tt; $done:tt;
        forward($recv:ident => $inner:expr $(, through $hook:ident)?) [$($name:ident),* $(,)?];
        $($groups:tt)*
    ) => {
        $crate::forward_store!(@next $attrs $generics $wrapper; $own; $done;
            ($recv, $inner, $($hook)?) [$($name)*]; $($groups)*);
    };
    // No group left: the impl, the own methods and the forwarded ones.
    (@group [$($attr:tt)*] [$($generics:tt)*] $wrapper:ty; { $($own:tt)* }; [$($done:tt)*];) => {
        $($attr)*
        #[$crate::forward::__async_trait]
        impl<$($generics)*> $crate::store::SessionStore for $wrapper {
            $($own)*
            $($done)*
        }
    };

    // One signature per method of the trait, the one place they are
    // written out after the trait itself.
    (@next $a:tt $g:tt $w:ty; $o:tt; $d:tt; $how:tt [acquire_writer $($names:ident)*]; $($rest:tt)*) => {
        $crate::forward_store!(@method {acquire_writer AcquireWriter
            (req: $crate::model::AcquireWriter) -> $crate::model::Acquired}
            $a $g $w; $o; $d; $how [$($names)*]; $($rest)*);
    };
    (@next $a:tt $g:tt $w:ty; $o:tt; $d:tt; $how:tt [release_writer $($names:ident)*]; $($rest:tt)*) => {
        $crate::forward_store!(@method {release_writer ReleaseWriter
            (key: &$crate::key::SessionKey, run_id: &str, fence_token: u64,
                owner_token: Option<&$crate::model::OwnerToken>) -> $crate::model::Released}
            $a $g $w; $o; $d; $how [$($names)*]; $($rest)*);
    };
    (@next $a:tt $g:tt $w:ty; $o:tt; $d:tt; $how:tt [append $($names:ident)*]; $($rest:tt)*) => {
        $crate::forward_store!(@method {append Append
            (req: $crate::model::AppendEntries) -> $crate::model::Appended}
            $a $g $w; $o; $d; $how [$($names)*]; $($rest)*);
    };
    (@next $a:tt $g:tt $w:ty; $o:tt; $d:tt; $how:tt [history $($names:ident)*]; $($rest:tt)*) => {
        $crate::forward_store!(@method {history History
            (query: $crate::model::HistoryQuery) -> $crate::model::HistoryPage}
            $a $g $w; $o; $d; $how [$($names)*]; $($rest)*);
    };
    (@next $a:tt $g:tt $w:ty; $o:tt; $d:tt; $how:tt [get_session $($names:ident)*]; $($rest:tt)*) => {
        $crate::forward_store!(@method {get_session GetSession
            (key: &$crate::key::SessionKey) -> Option<$crate::model::Session>}
            $a $g $w; $o; $d; $how [$($names)*]; $($rest)*);
    };
    (@next $a:tt $g:tt $w:ty; $o:tt; $d:tt; $how:tt [list_sessions $($names:ident)*]; $($rest:tt)*) => {
        $crate::forward_store!(@method {list_sessions ListSessions
            (query: $crate::model::ListQuery) -> Vec<$crate::model::Session>}
            $a $g $w; $o; $d; $how [$($names)*]; $($rest)*);
    };
    (@next $a:tt $g:tt $w:ty; $o:tt; $d:tt; $how:tt [reset_session $($names:ident)*]; $($rest:tt)*) => {
        $crate::forward_store!(@method {reset_session ResetSession
            (key: &$crate::key::SessionKey) -> $crate::model::ResetOutcome}
            $a $g $w; $o; $d; $how [$($names)*]; $($rest)*);
    };
    (@next $a:tt $g:tt $w:ty; $o:tt; $d:tt; $how:tt [delete_session $($names:ident)*]; $($rest:tt)*) => {
        $crate::forward_store!(@method {delete_session DeleteSession
            (key: &$crate::key::SessionKey, delete_transcript: bool) -> $crate::model::DeleteOutcome}
            $a $g $w; $o; $d; $how [$($names)*]; $($rest)*);
    };
    (@next $a:tt $g:tt $w:ty; $o:tt; $d:tt; $how:tt [patch_session $($names:ident)*]; $($rest:tt)*) => {
        $crate::forward_store!(@method {patch_session PatchSession
            (req: $crate::model::PatchSession) -> $crate::model::PatchOutcome}
            $a $g $w; $o; $d; $how [$($names)*]; $($rest)*);
    };
    (@next $a:tt $g:tt $w:ty; $o:tt; $d:tt; $how:tt [create_run $($names:ident)*]; $($rest:tt)*) => {
        $crate::forward_store!(@method {create_run CreateRun
            (new: $crate::model::NewRun) -> $crate::model::CreateRunOutcome}
            $a $g $w; $o; $d; $how [$($names)*]; $($rest)*);
    };
    (@next $a:tt $g:tt $w:ty; $o:tt; $d:tt; $how:tt [update_run $($names:ident)*]; $($rest:tt)*) => {
        $crate::forward_store!(@method {update_run UpdateRun
            (update: $crate::model::RunUpdate) -> $crate::model::RunRecord}
            $a $g $w; $o; $d; $how [$($names)*]; $($rest)*);
    };
    (@next $a:tt $g:tt $w:ty; $o:tt; $d:tt; $how:tt [get_run $($names:ident)*]; $($rest:tt)*) => {
        $crate::forward_store!(@method {get_run GetRun
            (run_id: &str) -> Option<$crate::model::RunRecord>}
            $a $g $w; $o; $d; $how [$($names)*]; $($rest)*);
    };
    (@next $a:tt $g:tt $w:ty; $o:tt; $d:tt; $how:tt [start_run $($names:ident)*]; $($rest:tt)*) => {
        $crate::forward_store!(@method {start_run StartRun
            (req: $crate::model::StartRun) -> $crate::model::Started}
            $a $g $w; $o; $d; $how [$($names)*]; $($rest)*);
    };
    (@next $a:tt $g:tt $w:ty; $o:tt; $d:tt; $how:tt [finish_run $($names:ident)*]; $($rest:tt)*) => {
        $crate::forward_store!(@method {finish_run FinishRun
            (req: $crate::model::FinishRun) -> $crate::model::Finished}
            $a $g $w; $o; $d; $how [$($names)*]; $($rest)*);
    };
    (@next $a:tt $g:tt $w:ty; $o:tt; $d:tt; $how:tt [list_active_runs $($names:ident)*]; $($rest:tt)*) => {
        $crate::forward_store!(@method {list_active_runs ListActiveRuns
            (owner: Option<&str>) -> Vec<$crate::model::RunRecord>}
            $a $g $w; $o; $d; $how [$($names)*]; $($rest)*);
    };
    (@next $a:tt $g:tt $w:ty; $o:tt; $d:tt; $how:tt [purge_expired_runs $($names:ident)*]; $($rest:tt)*) => {
        $crate::forward_store!(@method {purge_expired_runs PurgeExpiredRuns
            (ended_before_ms: i64) -> u64}
            $a $g $w; $o; $d; $how [$($names)*]; $($rest)*);
    };
    (@next $a:tt $g:tt $w:ty; $o:tt; $d:tt; $how:tt [acquire_leases $($names:ident)*]; $($rest:tt)*) => {
        $crate::forward_store!(@method {acquire_leases AcquireLeases
            (req: $crate::model::AcquireLeases) -> $crate::model::LeaseGrant}
            $a $g $w; $o; $d; $how [$($names)*]; $($rest)*);
    };
    (@next $a:tt $g:tt $w:ty; $o:tt; $d:tt; $how:tt [renew_leases $($names:ident)*]; $($rest:tt)*) => {
        $crate::forward_store!(@method {renew_leases RenewLeases
            (req: $crate::model::RenewLeases) -> $crate::model::LeaseGrant}
            $a $g $w; $o; $d; $how [$($names)*]; $($rest)*);
    };
    (@next $a:tt $g:tt $w:ty; $o:tt; $d:tt; $how:tt [release_leases $($names:ident)*]; $($rest:tt)*) => {
        $crate::forward_store!(@method {release_leases ReleaseLeases
            (tokens: Vec<$crate::model::OwnerToken>) -> Vec<u32>}
            $a $g $w; $o; $d; $how [$($names)*]; $($rest)*);
    };
    (@next $a:tt $g:tt $w:ty; $o:tt; $d:tt; $how:tt [list_leases $($names:ident)*]; $($rest:tt)*) => {
        $crate::forward_store!(@method {list_leases ListLeases
            () -> $crate::model::LeaseTable}
            $a $g $w; $o; $d; $how [$($names)*]; $($rest)*);
    };
    (@next $a:tt $g:tt $w:ty; $o:tt; $d:tt; $how:tt [heartbeat_member $($names:ident)*]; $($rest:tt)*) => {
        $crate::forward_store!(@method {heartbeat_member HeartbeatMember
            (req: $crate::model::MemberHeartbeat) -> $crate::model::MemberTable}
            $a $g $w; $o; $d; $how [$($names)*]; $($rest)*);
    };
    (@next $a:tt $g:tt $w:ty; $o:tt; $d:tt; $how:tt [leave_member $($names:ident)*]; $($rest:tt)*) => {
        $crate::forward_store!(@method {leave_member LeaveMember
            (member: &str) -> bool}
            $a $g $w; $o; $d; $how [$($names)*]; $($rest)*);
    };
    (@next $a:tt $g:tt $w:ty; $o:tt; $d:tt; $how:tt [list_members $($names:ident)*]; $($rest:tt)*) => {
        $crate::forward_store!(@method {list_members ListMembers
            () -> $crate::model::MemberTable}
            $a $g $w; $o; $d; $how [$($names)*]; $($rest)*);
    };
    // The group is done: the next one.
    (@next $a:tt $g:tt $w:ty; $o:tt; $d:tt; $how:tt []; $($rest:tt)*) => {
        $crate::forward_store!(@group $a $g $w; $o; $d; $($rest)*);
    };

    // One forwarded method, through the group's hook or straight.
    (@method {$name:ident $op:ident ($($arg:ident: $ty:ty),*) -> $out:ty}
        $a:tt $g:tt $w:ty; $o:tt; [$($done:tt)*]; ($recv:ident, $inner:expr, $hook:ident)
        $names:tt; $($rest:tt)*
    ) => {
        $crate::forward_store!(@next $a $g $w; $o; [$($done)*
            async fn $name(&$recv, $($arg: $ty),*) -> $crate::error::StoreResult<$out> {
                $recv.$hook(
                    $crate::forward::StoreOperation::$op,
                    $inner.$name($($arg),*),
                ).await
            }
        ]; ($recv, $inner, $hook) $names; $($rest)*);
    };
    (@method {$name:ident $op:ident ($($arg:ident: $ty:ty),*) -> $out:ty}
        $a:tt $g:tt $w:ty; $o:tt; [$($done:tt)*]; ($recv:ident, $inner:expr,)
        $names:tt; $($rest:tt)*
    ) => {
        $crate::forward_store!(@next $a $g $w; $o; [$($done)*
            async fn $name(&$recv, $($arg: $ty),*) -> $crate::error::StoreResult<$out> {
                $inner.$name($($arg),*).await
            }
        ]; ($recv, $inner,) $names; $($rest)*);
    };
}

#[cfg(test)]
mod tests {
    use super::StoreOperation;

    /// Tables indexed by `op as usize` are built from `ALL`.
    #[test]
    fn all_is_in_declaration_order() {
        for (index, op) in StoreOperation::ALL.iter().enumerate() {
            assert_eq!(*op as usize, index, "{op:?}");
        }
    }
}

crate::forward_store! {
    /// A shared store is a store (lets decorators wrap `Arc<dyn SessionStore>`).
    impl[T: crate::store::SessionStore + ?Sized] SessionStore for std::sync::Arc<T> {}
    forward(self => (**self)) [
        acquire_writer, release_writer, append, history, get_session, list_sessions,
        reset_session, delete_session, patch_session, create_run, update_run, get_run,
        start_run, finish_run, list_active_runs, purge_expired_runs, acquire_leases,
        renew_leases, release_leases, list_leases, heartbeat_member, leave_member, list_members,
    ];
}

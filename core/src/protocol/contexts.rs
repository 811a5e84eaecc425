//! A machine's code contexts on the wire (evervm additions): more interpreters in one machine,
//! each with its own globals and working directory.

use serde::{Deserialize, Serialize};

/// A context: the answer to its creation and restart, and an item of a list.
pub type ApiContext = evervm_engine::ContextInfo;

/// A context to make; an empty body, `null` and `{}` mean one in the machine's home.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(schemars::JsonSchema))]
pub struct CreateContextRequest {
    /// The directory its interpreter starts in (`~` and `~/...`: the machine's home). One that
    /// does not exist, or that the machine's user may not enter, leaves it in the home.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "server",
        schemars(with = "Option<super::schema::ContextCwd>")
    )]
    pub cwd: Option<String>,
}

/// A machine's contexts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(schemars::JsonSchema))]
pub struct ListContextsResponse {
    /// `default` (the machine's own interpreter) first, then the others in the order made.
    pub contexts: Vec<ApiContext>,
}

/// A removed context.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(schemars::JsonSchema))]
pub struct DeleteContextResponse {
    /// Always true.
    pub deleted: bool,
}

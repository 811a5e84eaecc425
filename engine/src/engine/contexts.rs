//! A machine's contexts: more interpreters in it, each with globals and a working directory of
//! its own, sharing its files, packages and environment (E2B's code contexts). Each operation
//! runs in the machine's turn among its instructions, under the same rate limit; instructions
//! name the context that runs them (`ExecRequest::context`).

use super::Engine;
use super::files::unexpected;
use crate::error::{Error, Result};
use crate::machine::{ContextOperation, FileOperation, FileOutcome};
use crate::types::{Account, ContextInfo, MAX_CONTEXT_CWD_CHARS, validate_context_id};

impl Engine {
    async fn context_operation(
        &self,
        account: &Account,
        name: &str,
        operation: ContextOperation,
    ) -> Result<Vec<ContextInfo>> {
        let handle = self.handle(account, name).await?;
        self.inner.take_instruction_token(account.id)?;
        match handle
            .file_operation(&self.inner, FileOperation::Context(operation))
            .await?
        {
            FileOutcome::Contexts(contexts) => Ok(contexts),
            _ => Err(unexpected()),
        }
    }

    /// Makes a context whose interpreter starts in `cwd` (none: the machine's home; a directory
    /// that does not exist leaves it in the home, as IPython's `%cd` does).
    pub async fn create_context(
        &self,
        account: &Account,
        name: &str,
        cwd: Option<&str>,
    ) -> Result<ContextInfo> {
        if let Some(cwd) = cwd
            && (cwd.is_empty() || cwd.chars().count() > MAX_CONTEXT_CWD_CHARS || cwd.contains('\0'))
        {
            return Err(Error::invalid(format!(
                "a context's working directory is a path of 1 to {MAX_CONTEXT_CWD_CHARS} \
                 characters without NUL"
            )));
        }
        let operation = ContextOperation::Create {
            cwd: cwd.map(str::to_owned),
        };
        let mut made = self.context_operation(account, name, operation).await?;
        made.pop().ok_or_else(unexpected)
    }

    /// The machine's contexts, the default first.
    pub async fn list_contexts(&self, account: &Account, name: &str) -> Result<Vec<ContextInfo>> {
        self.context_operation(account, name, ContextOperation::List)
            .await
    }

    /// Starts a context's interpreter again: its variables are gone, its working directory is
    /// the one it was made with.
    pub async fn restart_context(
        &self,
        account: &Account,
        name: &str,
        context: &str,
    ) -> Result<ContextInfo> {
        validate_context_id(context)?;
        let operation = ContextOperation::Restart {
            context: context.to_owned(),
        };
        let mut restarted = self.context_operation(account, name, operation).await?;
        restarted.pop().ok_or_else(unexpected)
    }

    /// Removes a context, its interpreter stopped.
    pub async fn remove_context(&self, account: &Account, name: &str, context: &str) -> Result<()> {
        validate_context_id(context)?;
        let operation = ContextOperation::Remove {
            context: context.to_owned(),
        };
        self.context_operation(account, name, operation).await?;
        Ok(())
    }
}

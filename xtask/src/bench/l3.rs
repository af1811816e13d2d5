use crate::report::Report;

pub fn run(_r: &mut Report) -> anyhow::Result<()> {
    anyhow::bail!("this section is not built yet")
}

// Loads a tensor's summary on demand (its blob is read only when asked for) and shows it as
// text.  The link still works without this script: it opens the summary as a page.
"use strict";
document.addEventListener("click", async (event) => {
  const link = event.target.closest("a.tensor-load");
  if (!link) {
    return;
  }
  event.preventDefault();
  const out = link.parentElement.querySelector(".tensor-summary");
  out.hidden = false;
  out.textContent = "loading…";
  try {
    const url = new URL(link.href);
    url.searchParams.set("format", "json");
    const response = await fetch(url, { headers: { Accept: "application/json" } });
    const body = await response.json();
    out.textContent = response.ok
      ? Object.entries(body).map(([key, value]) => `${key}: ${JSON.stringify(value)}`).join("\n")
      : `error: ${body.error}`;
  } catch (error) {
    out.textContent = `error: ${error}`;
  }
});

// The page is built into the Python package (agent/serving/web_assets), which serves it at `/`.
// WEB_OUT_DIR builds elsewhere: scripts/check_web_build.sh compares a fresh build with the shipped one.
import { defineConfig } from "vite";

export default defineConfig({
  base: "/",
  esbuild: { jsx: "automatic" },
  build: {
    outDir: process.env.WEB_OUT_DIR ?? "../agent/serving/web_assets",
    emptyOutDir: true,
    sourcemap: false,
    chunkSizeWarningLimit: 2000,
    rollupOptions: {
      // Radix and assistant-ui mark modules "use client" (for React Server Components); a page has no server part.
      onwarn(warning, warn) {
        if (warning.code === "MODULE_LEVEL_DIRECTIVE") return;
        warn(warning);
      },
    },
  },
});

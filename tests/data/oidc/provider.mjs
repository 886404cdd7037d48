// A real OpenID provider (npm oidc-provider, a certified implementation) for batchyard's
// single sign-on tests, on loopback. Started and stopped by tests/oidckit.py.
//
// argv: MODULE CONFIG.json
//   MODULE: the path of oidc-provider's lib/index.js (installed by scripts/setup.sh into
//           .cache/oidc-provider); CONFIG: {clients, accounts: {login: {email, name,
//           groups}}, jwks: {keys: [...]} (the signing keys; default: the library's own)}.
//           The accounts are read again at each sign-in: a test changes someone's groups
//           by rewriting the file.
// It listens on a free port of 127.0.0.1 and prints {"port": N, "issuer": URL} once ready.
// Device flow, authorization code flow (PKCE required), dynamic client registration (the
// tests register one client per batchyard server), devInteractions: a login form that
// takes any login (its password is ignored), then a consent form.
import http from 'node:http';
import fs from 'node:fs';
import { pathToFileURL } from 'node:url';

const [modulePath, configPath] = process.argv.slice(2);
const { default: Provider } = await import(pathToFileURL(modulePath).href);
const readConf = () => JSON.parse(fs.readFileSync(configPath, 'utf8'));
const conf = readConf();

const server = http.createServer();
server.listen(0, '127.0.0.1', () => {
  const { port } = server.address();
  const issuer = `http://127.0.0.1:${port}`;
  const provider = new Provider(issuer, {
    clients: conf.clients || [],
    ...(conf.jwks ? { jwks: conf.jwks } : {}),
    pkce: { required: () => true },
    features: {
      devInteractions: { enabled: true },
      deviceFlow: { enabled: true },
      registration: { enabled: true },
      revocation: { enabled: true },
    },
    claims: {
      openid: ['sub'],
      email: ['email', 'email_verified'],
      profile: ['name', 'preferred_username'],
      groups: ['groups'],
    },
    scopes: ['openid', 'email', 'profile', 'groups', 'offline_access'],
    async findAccount(ctx, id) {
      const accounts = readConf().accounts || {};
      const a = accounts[id] || { email: `${id}@example.test`, name: id, groups: [] };
      return {
        accountId: id,
        async claims() {
          return { sub: id, email: a.email, email_verified: true, name: a.name,
                   preferred_username: id, groups: a.groups || [] };
        },
      };
    },
    ttl: { DeviceCode: 600, AccessToken: 3600, IdToken: 3600, Interaction: 600,
           Session: 3600, Grant: 3600, AuthorizationCode: 60 },
  });
  provider.proxy = false;
  server.on('request', provider.callback());
  console.log(JSON.stringify({ port, issuer }));
});
for (const signal of ['SIGTERM', 'SIGINT']) process.on(signal, () => process.exit(0));

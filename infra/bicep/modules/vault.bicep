// The deployment's secrets: a Key Vault (RBAC, no access policies) holding the Earthdata
// Login token the workers send to NASA's archives and the Planetary Computer subscription
// key they send with its STAC API's and token endpoint's requests, each if given. The
// Function App reads them through Key Vault references in its app settings, the workers
// through Container Apps secrets; both identities get Key Vault Secrets User on this vault only.

param prefix string
param suffix string
param location string
@secure()
param earthdataToken string = ''
@secure()
param pcSubscriptionKey string = ''

resource vault 'Microsoft.KeyVault/vaults@2023-07-01' = {
  name: take('${prefix}kv${suffix}', 24)
  location: location
  properties: {
    tenantId: subscription().tenantId
    sku: { family: 'A', name: 'standard' }
    enableRbacAuthorization: true
    enableSoftDelete: true
  }
}

resource token 'Microsoft.KeyVault/vaults/secrets@2023-07-01' = if (!empty(earthdataToken)) {
  parent: vault
  name: 'earthdata-token'
  properties: { value: earthdataToken }
}

resource key 'Microsoft.KeyVault/vaults/secrets@2023-07-01' = if (!empty(pcSubscriptionKey)) {
  parent: vault
  name: 'pc-subscription-key'
  properties: { value: pcSubscriptionKey }
}

output name string = vault.name
output secretUri string = empty(earthdataToken) ? '' : '${vault.properties.vaultUri}secrets/earthdata-token'
output keyUri string = empty(pcSubscriptionKey) ? '' : '${vault.properties.vaultUri}secrets/pc-subscription-key'

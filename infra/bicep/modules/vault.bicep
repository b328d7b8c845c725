// The deployment's secrets: a Key Vault (RBAC, no access policies) holding the Earthdata
// Login token the workers send to NASA's archives. The Function App reads it through a Key
// Vault reference in its app settings, the workers through a Container Apps secret; both
// identities get Key Vault Secrets User on this vault only.

param prefix string
param suffix string
param location string
@secure()
param earthdataToken string

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

resource token 'Microsoft.KeyVault/vaults/secrets@2023-07-01' = {
  parent: vault
  name: 'earthdata-token'
  properties: { value: earthdataToken }
}

output name string = vault.name
output secretUri string = '${vault.properties.vaultUri}secrets/${token.name}'
